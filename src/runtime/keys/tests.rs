//! The key layout's unit tests.

use super::*;
use crate::runtime::scripting::scripts;

fn tag_of(key: &[u8]) -> &[u8] {
    let open = key.iter().position(|&b| b == b'{').unwrap();
    let len = key[open + 1..].iter().position(|&b| b == b'}').unwrap();
    &key[open + 1..open + 1 + len]
}

/// The keys of a plain lock called `name`.
fn lock_keys(prefix: &[u8], name: &[u8]) -> LockKeys {
    LockKeys::new(prefix, name.to_vec(), "c1", Object::Lock, &scripts::PLAIN)
}

#[test]
fn every_object_key_gives_back_its_name() {
    let prefix = b"redmutex:";
    for name in adversarial_names().into_iter().filter(|n| !n.is_empty()) {
        for object in [Object::Lock, Object::ReadWrite, Object::Semaphore] {
            let k = LockKeys::new(prefix, name.clone(), "c1", object, &scripts::PLAIN);
            assert_eq!(
                object_of(prefix, k.key()),
                Some((object, false, name.clone()))
            );
            // (Channels are not keys: `SCAN` never shows them.)
            for aux in [
                &k.queue()[..],
                &k.fence(),
                &k.waiters(),
                &k.latch_setter(),
                &k.forced(),
                &k.probe(7),
            ] {
                assert_eq!(
                    object_of(prefix, aux),
                    None,
                    "{:?}",
                    String::from_utf8_lossy(aux)
                );
            }
            if object == Object::Lock {
                assert_eq!(
                    object_of(prefix, &k.latch()),
                    Some((object, true, name.clone()))
                );
            }
            if object == Object::Semaphore {
                // Its number of permits: the semaphore, defined with no permit held.
                assert_eq!(
                    object_of(prefix, &k.permits()),
                    Some((object, false, name.clone()))
                );
            }
        }
    }
    assert_eq!(object_of(prefix, b"other:{x}"), None);
}

/// The names a handle reads back from its one allocation: the name and the kind of
/// object from the key, the others from where the key ends.
#[test]
fn every_name_is_read_back_from_the_key() {
    for prefix in [&b"redmutex:"[..], b"", b"p:"] {
        for name in adversarial_names() {
            for (object, ops, hold) in [
                (Object::Lock, &scripts::PLAIN, b'x'),
                (Object::ReadWrite, &scripts::READ, b'r'),
                (Object::ReadWrite, &scripts::WRITE, b'x'),
                (Object::ReadWrite, &scripts::UPGRADEABLE, b'u'),
                (Object::Semaphore, &scripts::PERMITS, b'x'),
            ] {
                let k = LockKeys::new(prefix, name.clone(), "c1", object, ops);
                assert_eq!(k.name(), name);
                assert_eq!(k.object(), object);
                assert_eq!(k.inbox(), [k.key(), &b":to:"[..]].concat());
                assert_eq!(k.channel(), [k.key(), &b":to:c1"[..]].concat());
                assert_eq!(k.hold(), [&[hold][..], k.key()].concat());
                assert_eq!(
                    k.read_hold(),
                    (object == Object::ReadWrite && hold != b'r')
                        .then(|| [&b"r"[..], k.key()].concat())
                );
                assert_eq!(
                    k.upgradeable_hold(),
                    (object == Object::ReadWrite && hold == b'x')
                        .then(|| [&b"u"[..], k.key()].concat())
                );
                assert_eq!(k.has_leases(), !k.leases().is_empty());
                assert_eq!(object == Object::Semaphore, !k.permits().is_empty());
            }
        }
    }
}

/// Every handle of a name passes the same four main keys, its own and the three
/// others (its own kind left out), in one hash slot, and the latch's are the lock's
/// latch key's others.
#[test]
fn the_kinds_of_a_name_share_their_main_keys_and_slot() {
    for prefix in [&b"redmutex:"[..], b"", b"p:"] {
        for name in adversarial_names().into_iter().filter(|n| !n.is_empty()) {
            let lock = LockKeys::new(prefix, name.clone(), "c1", Object::Lock, &scripts::PLAIN);
            let rw = LockKeys::new(
                prefix,
                name.clone(),
                "c1",
                Object::ReadWrite,
                &scripts::READ,
            );
            let sem = LockKeys::new(
                prefix,
                name.clone(),
                "c1",
                Object::Semaphore,
                &scripts::PERMITS,
            );
            let all = [
                lock.key().to_vec(),
                rw.key().to_vec(),
                sem.key().to_vec(),
                lock.latch(),
            ];
            let but = |i: usize| -> Vec<Vec<u8>> {
                all.iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, k)| k.clone())
                    .collect()
            };
            assert_eq!(lock.other_kinds(false).to_vec(), but(0));
            assert_eq!(rw.other_kinds(false).to_vec(), but(1));
            assert_eq!(sem.other_kinds(false).to_vec(), but(2));
            for k in [&lock, &rw, &sem] {
                assert_eq!(k.other_kinds(true).to_vec(), but(3));
            }
            for key in &all {
                assert_eq!(tag_of(key), tag_of(lock.key()), "{name:?}");
            }
        }
    }
    assert_eq!(kind_name(2), "read-write lock");
    assert_eq!(kind_name(9), "different kind of object");
}

#[test]
fn plain_names_are_wrapped_in_a_tag() {
    let k = lock_keys(b"redmutex:", b"orders");
    assert_eq!(k.key(), b"redmutex:{orders}");
    assert_eq!(k.channel(), b"redmutex:{orders}:to:c1");
    assert_eq!(k.queue(), b"redmutex:!queue:{orders}");
}

#[test]
fn names_with_a_tag_keep_it() {
    let k = lock_keys(b"p:", b"user:{42}:cart");
    assert_eq!(k.key(), b"p:~user:{42}:cart");
    assert_eq!(tag_of(k.channel()), b"42");
}

#[test]
fn awkward_names_still_share_one_nonempty_tag() {
    for name in [&b"}x"[..], b"a{}b", b"{}", b"}{", b"x}{y}"] {
        let k = lock_keys(b"redmutex:", name);
        assert!(
            has_hash_tag(k.key()),
            "{:?}",
            String::from_utf8_lossy(k.key())
        );
        assert_eq!(tag_of(k.key()), tag_of(k.channel()));
        assert!(k.key().ends_with(name));
    }
}

#[test]
fn distinct_names_get_distinct_keys() {
    let names: [&[u8]; 9] = [
        b"a", b"{a}", b"~{a}", b"}a", b"#{0}a", b"a}", b"{a", b"", b"{}",
    ];
    let keys: std::collections::HashSet<Vec<u8>> = names
        .iter()
        .map(|n| lock_keys(b"p:", n).key().to_vec())
        .collect();
    assert_eq!(keys.len(), names.len());
}

/// Names built to collide with an auxiliary key of another name, for every key form.
fn adversarial_names() -> Vec<Vec<u8>> {
    let bases: [&[u8]; 6] = [b"x", b"{x}", b"user:{42}", b"}x", b"a{}b", b""];
    let suffixes: [&[u8]; 8] = [
        b"",
        b":fence",
        b":released",
        b":to:c1",
        b":queue",
        b":timeouts",
        b":permits",
        b"!fence:",
    ];
    let mut names = Vec::new();
    for base in bases {
        for suffix in suffixes {
            names.push([base, suffix].concat());
            names.push([suffix, base].concat());
        }
    }
    names.push(b"!fence:{x}".to_vec());
    names.push(b"{!fence:{x}}".to_vec());
    names.sort();
    names.dedup();
    names
}

#[test]
fn no_lock_key_is_an_auxiliary_key_of_any_name() {
    for prefix in [&b"redmutex:"[..], b"", b"p:"] {
        let objects = [
            (Object::Lock, &scripts::PLAIN),
            (Object::ReadWrite, &scripts::READ),
            (Object::Semaphore, &scripts::PERMITS),
        ];
        let all: Vec<LockKeys> = adversarial_names()
            .into_iter()
            .flat_map(|n| {
                objects.map(|(object, ops)| LockKeys::new(prefix, n.clone(), "c1", object, ops))
            })
            .collect();
        let lock_keys: std::collections::HashSet<&[u8]> = all.iter().map(|k| k.key()).collect();
        assert_eq!(lock_keys.len(), all.len(), "distinct names, distinct keys");
        for k in &all {
            for aux in [
                &k.fence()[..],
                &k.queue(),
                &k.waiters(),
                &k.latch(),
                &k.latch_setter(),
                &k.forced(),
                &k.leases(),
                &k.permits(),
            ] {
                if aux.is_empty() {
                    continue;
                }
                assert!(
                    !lock_keys.contains(aux),
                    "an auxiliary key of {:?} is a lock key",
                    String::from_utf8_lossy(k.name())
                );
                assert_eq!(tag_of(aux), tag_of(k.key()), "same slot");
                assert!(aux.starts_with(prefix));
            }
        }
        let counters: std::collections::HashSet<Vec<u8>> = all.iter().map(|k| k.fence()).collect();
        assert_eq!(
            counters.len(),
            all.len(),
            "distinct names, distinct counters"
        );
    }
}

/// Every key (lock or auxiliary, of every object) of every name under each of a set of
/// accepted prefixes, some starting others: no key belongs to two prefixes.
#[test]
fn keys_of_different_accepted_prefixes_never_meet() {
    let candidates = [
        "",
        "a",
        "a:",
        "a:queue:",
        "aqueue:",
        "a!queue:",
        "a!",
        "a~",
        "a#",
        "a{",
        "!",
        "redmutex:",
        "redmutex:a",
    ];
    let accepted: Vec<&str> = candidates
        .into_iter()
        .filter(|p| check_prefix(p).is_ok())
        .collect();
    assert_eq!(
        accepted,
        [
            "",
            "a",
            "a:",
            "a:queue:",
            "aqueue:",
            "redmutex:",
            "redmutex:a"
        ]
    );
    let objects = [
        (Object::Lock, &scripts::PLAIN),
        (Object::ReadWrite, &scripts::READ),
        (Object::Semaphore, &scripts::PERMITS),
    ];
    let mut owner: std::collections::HashMap<Vec<u8>, &str> = Default::default();
    for prefix in &accepted {
        for name in adversarial_names() {
            for (object, ops) in objects {
                let k = LockKeys::new(prefix.as_bytes(), name.clone(), "c1", object, ops);
                for key in [
                    k.key(),
                    &k.fence(),
                    &k.queue(),
                    &k.waiters(),
                    &k.latch(),
                    &k.leases(),
                    &k.permits(),
                ] {
                    if key.is_empty() {
                        continue;
                    }
                    let was = owner.insert(key.to_vec(), prefix);
                    assert!(
                        was.is_none_or(|was| was == *prefix),
                        "{:?} is a key of prefixes {was:?} and {prefix:?}",
                        String::from_utf8_lossy(key)
                    );
                }
            }
        }
    }
    // What the refusal prevents.
    let inner = lock_keys(b"a!queue:", b"x");
    assert_eq!(inner.key(), lock_keys(b"a", b"x").queue());
}

/// Names built from pieces of the key forms (braces, marks, kinds, the old marker's
/// suffix): every sequence of up to three pieces, and the adversarial names.
fn generated_names() -> Vec<Vec<u8>> {
    let pieces: [&[u8]; 13] = [
        b"x", b"{", b"}", b"~", b"#", b"!", b":", b"{t}", b":!oom", b"!oom:", b"oom", b"!rw:",
        b"!queue:",
    ];
    let mut names: Vec<Vec<u8>> = vec![Vec::new()];
    let mut last = names.clone();
    for _ in 0..3 {
        last = last
            .iter()
            .flat_map(|n| pieces.map(|p| [&n[..], p].concat()))
            .collect();
        names.extend(last.iter().cloned());
    }
    names.extend(adversarial_names());
    names.retain(|n| !n.is_empty());
    names.sort();
    names.dedup();
    names
}

/// Issue 26, item 1: every key the library writes for an object of a name (its own
/// key, the fencing counter, queue, waiters, leases, permits, call ids, latch, and the
/// marker the EVALSHA scripts delete) is a key of that object and role alone: no
/// other name, prefix, object or role ever has it. The marker was `<key>:!oom`, which
/// for a name with a hash tag is the key of the name `<name>:!oom`.
#[test]
fn no_key_written_for_a_name_is_a_key_of_another_name() {
    let prefixes = [
        "",
        "a",
        "a:",
        "a:queue:",
        "aoom:",
        "redmutex:",
        "redmutex:a",
    ];
    let objects = [
        (Object::Lock, &scripts::PLAIN),
        (Object::ReadWrite, &scripts::WRITE),
        (Object::Semaphore, &scripts::PERMITS),
    ];
    let names = generated_names();
    assert!(names.len() > 2_000, "{} names", names.len());
    let mut owner: std::collections::HashMap<Vec<u8>, (&str, Vec<u8>, Object, &str)> =
        Default::default();
    for prefix in prefixes {
        assert_eq!(check_prefix(prefix), Ok(()));
        for name in &names {
            for (object, ops) in objects {
                let k = LockKeys::new(prefix.as_bytes(), name.clone(), "c1", object, ops);
                let mut written = vec![
                    ("key", k.key().to_vec()),
                    ("fence", k.fence()),
                    ("queue", k.queue()),
                    ("waiters", k.waiters()),
                    ("forced", k.forced()),
                    ("leases", k.leases()),
                    ("permits", k.permits()),
                ];
                if object == Object::Lock {
                    written.push(("latch", k.latch()));
                    written.push(("setter", k.latch_setter()));
                }
                for (role, key) in written {
                    if key.is_empty() {
                        continue;
                    }
                    assert!(key.starts_with(prefix.as_bytes()));
                    assert_eq!(tag_of(&key), tag_of(k.key()), "same slot");
                    let this = (prefix, name.clone(), object, role);
                    if let Some(was) = owner.insert(key.clone(), this.clone()) {
                        panic!(
                            "{:?} is the {} of {:?} and the {} of {:?}",
                            String::from_utf8_lossy(&key),
                            was.3,
                            (was.0, String::from_utf8_lossy(&was.1), was.2),
                            this.3,
                            (this.0, String::from_utf8_lossy(&this.1), this.2),
                        );
                    }
                }
            }
        }
    }
    // What the old marker did: named after the lock key, it was another lock's key.
    let old_marker = [lock_keys(b"p:", b"job{t}").key(), b":!oom"].concat();
    assert_eq!(old_marker, lock_keys(b"p:", b"job{t}:!oom").key());
}

#[test]
fn thread_tokens_differ_between_threads() {
    let here = thread_token();
    let there = std::thread::spawn(thread_token).join().unwrap();
    assert_ne!(here, there);
    assert_eq!(here, thread_token());
}
