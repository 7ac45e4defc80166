//! From the URLs a `ClientBuilder` is given to the deployment's connection settings: the
//! sentinels' or cluster nodes' addresses, TLS certificates, and URLs with their passwords
//! hidden for messages.

use std::time::Duration;

use redis::IntoConnectionInfo;

use crate::runtime::connection::target::{Cluster, Target};
use crate::Error;

/// The connection settings of `urls` (at least one), and the URLs with passwords hidden.
pub(crate) fn parse_urls(
    urls: &[String],
    what: &str,
) -> Result<(Vec<redis::ConnectionInfo>, Vec<String>), Error> {
    if urls.is_empty() {
        return Err(Error::invalid(format!(
            "{what} addresses: at least one is needed"
        )));
    }
    let infos = urls
        .iter()
        .map(|url| {
            url.as_str()
                .into_connection_info()
                .map_err(|e| match bad_url(url, &e) {
                    Error::InvalidUrl { url, part, reason } => Error::InvalidUrl {
                        url: format!("{url} (a {what} address)").into_boxed_str(),
                        part,
                        reason,
                    },
                    other => other,
                })
        })
        .collect::<Result<_, _>>()?;
    Ok((infos, urls.iter().map(|u| redact_url(u)).collect()))
}

/// The schemes redis-rs takes.
const SCHEMES: [&str; 7] = [
    "redis",
    "rediss",
    "valkey",
    "valkeys",
    "redis+unix",
    "valkey+unix",
    "unix",
];

/// What the URL should look like, for messages.
const FORM: &str = "redis://[user:password@]host[:port][/db] (rediss:// for TLS, \
    redis+unix:///path/to.sock for a socket)";

/// Says which part of `url` is wrong, when redis-rs cannot use it (`e`): a whole-URL
/// "did not parse" helps nobody find the typo. A failure with no part to blame (TLS
/// settings with a plain URL...) stays the `InvalidArgument` it was.
pub(crate) fn bad_url(url: &str, e: &redis::RedisError) -> Error {
    match wrong_part(url) {
        Some((part, reason)) => Error::InvalidUrl {
            url: redact_url(url).into_boxed_str(),
            part,
            reason: reason.into_boxed_str(),
        },
        None => Error::invalid(format!("bad redis url {}: {e}", redact_url(url))),
    }
}

/// The part of `url` that is wrong and why, as far as it can be told from the text.
fn wrong_part(url: &str) -> Option<(&'static str, String)> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Some(("scheme", format!("is missing: write {FORM}")));
    };
    if !SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) {
        return Some((
            "scheme",
            format!(
                "{scheme:?} is not one of {}: write {FORM}",
                SCHEMES.join(", ")
            ),
        ));
    }
    if scheme.ends_with("unix") {
        return rest
            .split(['?', '#'])
            .next()
            .is_none_or(|p| p.trim_start_matches('/').is_empty())
            .then(|| ("path", "of the socket is missing".to_owned()));
    }
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    if tail
        .split(['?', '#'])
        .next()
        .is_some_and(|t| t.contains('@'))
    {
        // A `/` in the password ends the authority early: what follows would be read as
        // the port or the database, and quoting it would show part of the password.
        return Some((
            "password",
            "or user holds a '/', '?' or '#': write it percent-encoded (%2F, %3F, %23)".to_owned(),
        ));
    }
    let host_port = authority
        .rfind('@')
        .map_or(authority, |at| &authority[at + 1..]);
    let (host, port) = match host_port.strip_prefix('[') {
        // An IPv6 address: [::1]:6379.
        Some(v6) => match v6.split_once(']') {
            Some((host, after)) => (host, after.strip_prefix(':')),
            None => return Some(("host", "has a '[' without its ']'".to_owned())),
        },
        None => match host_port.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        },
    };
    if host.is_empty() {
        return Some(("host", format!("is missing: write {FORM}")));
    }
    if let Some(port) = port {
        if !port.is_empty() && port.parse::<u16>().is_err() {
            return Some((
                "port",
                format!("{port:?} is not a port number (1 to 65535; 6379 by default)"),
            ));
        }
    }
    let path = tail.split(['?', '#']).next().unwrap_or("");
    let db = path.trim_start_matches('/');
    if !db.is_empty() && db.parse::<i64>().is_err() {
        return Some((
            "database",
            format!("{db:?} is not a database number: write /0, /1..., or nothing for 0"),
        ));
    }
    None
}

/// A cluster target from its node URLs.
pub(crate) fn cluster_target(
    urls: Vec<String>,
    connect_timeout: Duration,
    command_timeout: Duration,
    certificates: Option<Certificates>,
) -> Result<(Target, String), Error> {
    let (nodes, urls) = parse_urls(&urls, "cluster node")?;
    // redis-rs follows MOVED and ASK itself; its default pause before a retry starts at
    // 1.28 s, far past the bounds of a `try_lock_for`. Short pauses here, and a refusal
    // that outlasts them (a migration under way) is retried by the client within the
    // call's deadline.
    let builder = redis::cluster::ClusterClientBuilder::new(nodes.clone())
        .connection_timeout(connect_timeout)
        .response_timeout(command_timeout)
        .retries(8)
        .retry_wait_formula(1, 2)
        .min_retry_wait(1)
        .max_retry_wait(50);
    let client = with_certificates(builder, certificates)
        .build()
        .map_err(|e| Error::invalid(format!("bad cluster settings: {e}")))?;
    Ok((
        Target::Cluster(Cluster::new(client, nodes)),
        format!("cluster via {urls:?}"),
    ))
}

#[cfg(feature = "tls")]
pub(crate) type Certificates = redis::TlsCertificates;
#[cfg(not(feature = "tls"))]
pub(crate) type Certificates = ();

#[cfg(feature = "tls")]
pub(crate) fn tls_certificates(
    ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
) -> Option<Certificates> {
    if ca.is_none() && client.is_none() {
        return None;
    }
    Some(redis::TlsCertificates {
        client_tls: client.map(|(client_cert, client_key)| redis::ClientTlsConfig {
            client_cert,
            client_key,
        }),
        root_cert: ca,
    })
}

#[cfg(not(feature = "tls"))]
pub(crate) fn tls_certificates(
    _: Option<Vec<u8>>,
    _: Option<(Vec<u8>, Vec<u8>)>,
) -> Option<Certificates> {
    None
}

#[cfg(feature = "tls")]
fn with_certificates(
    builder: redis::cluster::ClusterClientBuilder,
    certificates: Option<Certificates>,
) -> redis::cluster::ClusterClientBuilder {
    match certificates {
        Some(certs) => builder.certs(certs),
        None => builder,
    }
}

#[cfg(not(feature = "tls"))]
fn with_certificates(
    builder: redis::cluster::ClusterClientBuilder,
    _: Option<Certificates>,
) -> redis::cluster::ClusterClientBuilder {
    builder
}

#[cfg(feature = "tls")]
pub(crate) fn tls_client(
    url: &str,
    ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
) -> redis::RedisResult<redis::Client> {
    redis::Client::build_with_tls(
        url,
        redis::TlsCertificates {
            client_tls: client.map(|(client_cert, client_key)| redis::ClientTlsConfig {
                client_cert,
                client_key,
            }),
            root_cert: ca,
        },
    )
}

#[cfg(not(feature = "tls"))]
pub(crate) fn tls_client(
    _: &str,
    _: Option<Vec<u8>>,
    _: Option<(Vec<u8>, Vec<u8>)>,
) -> redis::RedisResult<redis::Client> {
    unreachable!("TLS settings exist only with the `tls` feature")
}

/// `url` with any password replaced by `***`, for messages and `Debug`.
pub(crate) fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    // The userinfo ends at the last '@' before the query: a '/' typed in a password (not
    // percent-encoded) must not end it early and leave the rest of the password shown.
    let authority_end = rest.find(['?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return redact_query(url);
    };
    let userinfo = &rest[..at];
    let user = userinfo.split(':').next().unwrap_or("");
    let hidden = if userinfo.contains(':') {
        format!("{user}:***")
    } else {
        // `redis://secret@host` puts the password where a user would be.
        "***".to_owned()
    };
    redact_query(&format!("{}{hidden}{}", &url[..scheme_end], &rest[at..]))
}

/// `url` with the value of a `pass=` query parameter (a Unix socket URL's password)
/// replaced by `***`.
fn redact_query(url: &str) -> String {
    let Some(q) = url.find('?') else {
        return url.to_owned();
    };
    let (head, query) = url.split_at(q + 1);
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some(("pass", _)) => "pass=***".to_owned(),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{head}{}", pairs.join("&"))
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact_url("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("redis://:pw@h"), "redis://:***@h");
        assert_eq!(redact_url("redis://pw@h/"), "redis://***@h/");
        assert_eq!(redact_url("redis://h:6379/"), "redis://h:6379/");
        assert_eq!(redact_url("rediss://a:b:c@h"), "rediss://a:***@h");
        assert_eq!(redact_url("redis://u:pa/ss@h/0"), "redis://u:***@h/0");
        assert_eq!(
            redact_url("redis+unix:///tmp/r.sock?db=1&pass=pw"),
            "redis+unix:///tmp/r.sock?db=1&pass=***"
        );
    }

    #[test]
    fn a_bad_url_names_its_part_and_never_the_password() {
        let part = |url: &str| {
            super::wrong_part(url).map(|(part, why)| {
                assert!(!why.contains("pw"), "{url}: {why}");
                part
            })
        };
        assert_eq!(part("localhost:6379"), Some("scheme"));
        assert_eq!(part("http://h/"), Some("scheme"));
        assert_eq!(part("redis://u:pw@/"), Some("host"));
        assert_eq!(part("redis://h:63x9/"), Some("port"));
        assert_eq!(part("redis://[::1]:70000/"), Some("port"));
        assert_eq!(part("redis://[::1/"), Some("host"));
        assert_eq!(part("redis://h/zero"), Some("database"));
        assert_eq!(part("redis://u:p/w@h/"), Some("password"));
        assert_eq!(part("redis+unix://"), Some("path"));
        assert_eq!(part("redis://u:pw@h:6379/0"), None);
        assert_eq!(part("redis://[::1]:6379"), None);
    }
}
