//! How an error's message shows a lock's name (escaped, cut short) and a timeout's reason.

/// The longest part of a name an error message shows, in bytes of the name.
const SHOWN: usize = 256;

/// `name` as text that is safe to print: see [`Error::lock_name`].
pub(super) fn printable(name: &[u8]) -> Box<str> {
    let cut = name.len() > SHOWN;
    let mut out = String::with_capacity(name.len().min(SHOWN) + 8);
    for chunk in name[..name.len().min(SHOWN)].utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() || c == '"' || c == '\\' {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    if cut {
        out.push('…');
    }
    out.into_boxed_str()
}

/// Displays `: <why>` after a timeout's message, for a reason of redmutex's own; nothing
/// for an OS error, which says nothing the message does not.
pub(super) struct Why<'a>(pub(super) &'a redis::RedisError);

impl std::fmt::Display for Why<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.0.to_string();
        if text.contains("(os error ") {
            Ok(())
        } else {
            write!(f, ": {text}")
        }
    }
}
