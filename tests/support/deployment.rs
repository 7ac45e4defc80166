//! The Redis deployment a demo or bench runs against: one server, a Sentinel service or a
//! cluster, given by the environment or spawned for the run (the embedded default).
//!
//! `REDIS_URL` names a server, `REDIS_SENTINELS` (comma-separated sentinel URLs, with
//! `REDIS_SENTINEL_SERVICE`, default `mymaster`) a Sentinel service, `REDIS_CLUSTER`
//! (comma-separated node URLs) a cluster. Without them the shape asked for is started
//! on loopback: a server, a primary with 2 replicas and 3 sentinels, or 3 primaries.

use std::fmt;

use super::topology::{Cluster, Sentinels};
use super::RedisServer;

/// The shapes of deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Single,
    Sentinel,
    Cluster,
}

/// Where Redis is: enough to build clients (also in another process, via `to_env`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deployment {
    Single(String),
    Sentinel {
        sentinels: Vec<String>,
        service: String,
    },
    Cluster(Vec<String>),
}

/// What was started for the run, if anything; dropping it stops it.
pub enum Embedded {
    External,
    Server(RedisServer),
    Sentinels(Sentinels),
    Cluster(Cluster),
}

impl fmt::Display for Embedded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Embedded::External => write!(f, "from the environment"),
            Embedded::Server(s) => write!(f, "embedded, port {}", s.port()),
            Embedded::Sentinels(t) => write!(
                f,
                "embedded: 1 primary, {} replicas, {} sentinels",
                t.nodes().len() - 1,
                t.sentinels().len()
            ),
            Embedded::Cluster(c) => {
                write!(f, "embedded: cluster of {} primaries", c.primaries().len())
            }
        }
    }
}

fn list(var: &str) -> Option<Vec<String>> {
    let value = std::env::var(var).ok()?;
    let urls: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    (!urls.is_empty()).then_some(urls)
}

/// The deployment of `shape` from the environment, else a throwaway one.
pub fn deployment_or_spawn(shape: Shape) -> (Deployment, Embedded) {
    match shape {
        Shape::Single => match list("REDIS_URL") {
            Some(urls) => (Deployment::Single(urls[0].clone()), Embedded::External),
            None => {
                let server = RedisServer::new();
                (Deployment::Single(server.url()), Embedded::Server(server))
            }
        },
        Shape::Sentinel => match list("REDIS_SENTINELS") {
            Some(sentinels) => (
                Deployment::Sentinel {
                    sentinels,
                    service: std::env::var("REDIS_SENTINEL_SERVICE")
                        .unwrap_or_else(|_| "mymaster".to_owned()),
                },
                Embedded::External,
            ),
            None => {
                let topo = Sentinels::new(2, 3);
                (
                    Deployment::Sentinel {
                        sentinels: topo.sentinel_urls(),
                        service: topo.service_name().to_owned(),
                    },
                    Embedded::Sentinels(topo),
                )
            }
        },
        Shape::Cluster => match list("REDIS_CLUSTER") {
            Some(nodes) => (Deployment::Cluster(nodes), Embedded::External),
            None => {
                let cluster = Cluster::new(3, 0);
                (
                    Deployment::Cluster(cluster.seed_urls()),
                    Embedded::Cluster(cluster),
                )
            }
        },
    }
}

impl Deployment {
    /// A client builder for this deployment (other settings at their defaults).
    pub fn builder(&self) -> redmutex::ClientBuilder {
        let builder = redmutex::Client::builder();
        match self {
            Deployment::Single(url) => builder.url(url.as_str()),
            Deployment::Sentinel { sentinels, service } => {
                builder.sentinel(sentinels.clone(), service.as_str())
            }
            Deployment::Cluster(nodes) => builder.cluster(nodes.clone()),
        }
    }

    /// One line for an environment variable; read back by [`from_env`](Self::from_env).
    pub fn to_env(&self) -> String {
        match self {
            Deployment::Single(url) => format!("single {url}"),
            Deployment::Sentinel { sentinels, service } => {
                format!("sentinel {service} {}", sentinels.join(","))
            }
            Deployment::Cluster(nodes) => format!("cluster {}", nodes.join(",")),
        }
    }

    pub fn from_env(line: &str) -> Deployment {
        let mut words = line.split_whitespace();
        let urls = |w: Option<&str>| -> Vec<String> {
            w.unwrap_or_default()
                .split(',')
                .map(str::to_owned)
                .collect()
        };
        match words.next() {
            Some("single") => Deployment::Single(words.next().unwrap_or_default().to_owned()),
            Some("sentinel") => {
                let service = words.next().unwrap_or_default().to_owned();
                Deployment::Sentinel {
                    sentinels: urls(words.next()),
                    service,
                }
            }
            Some("cluster") => Deployment::Cluster(urls(words.next())),
            _ => panic!("not a deployment: {line:?}"),
        }
    }

    pub fn shape(&self) -> Shape {
        match self {
            Deployment::Single(_) => Shape::Single,
            Deployment::Sentinel { .. } => Shape::Sentinel,
            Deployment::Cluster(_) => Shape::Cluster,
        }
    }

    /// URLs of the primaries now: the server, the primary the sentinels name, or every
    /// primary of the cluster (`CLUSTER NODES` on the first reachable node).
    pub fn primaries(&self) -> Vec<String> {
        match self {
            Deployment::Single(url) => vec![url.clone()],
            Deployment::Sentinel { sentinels, service } => {
                let (host, port): (String, u16) = sentinels
                    .iter()
                    .find_map(|s| {
                        let mut con = redis::Client::open(s.as_str())
                            .ok()?
                            .get_connection()
                            .ok()?;
                        redis::cmd("SENTINEL")
                            .arg("get-master-addr-by-name")
                            .arg(service)
                            .query(&mut con)
                            .ok()
                    })
                    .expect("a sentinel names the primary");
                vec![format!("redis://{host}:{port}/")]
            }
            Deployment::Cluster(nodes) => {
                let text: String = nodes
                    .iter()
                    .find_map(|n| {
                        let mut con = redis::Client::open(n.as_str())
                            .ok()?
                            .get_connection()
                            .ok()?;
                        redis::cmd("CLUSTER").arg("NODES").query(&mut con).ok()
                    })
                    .expect("a cluster node answers CLUSTER NODES");
                text.lines()
                    .filter(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("master")))
                    .filter(|l| !l.split(' ').nth(2).is_some_and(|f| f.contains("fail")))
                    .filter_map(|l| {
                        let addr = l.split(' ').nth(1)?.split('@').next()?;
                        Some(format!("redis://{addr}/"))
                    })
                    .collect()
            }
        }
    }

    /// A plain connection for data the demo keeps beside its locks: to the primary, or a
    /// cluster connection that routes each key.
    pub fn data_connection(&self) -> Box<dyn redis::ConnectionLike + Send> {
        match self {
            Deployment::Cluster(nodes) => Box::new(
                redis::cluster::ClusterClient::new(nodes.clone())
                    .and_then(|c| c.get_connection())
                    .expect("cluster data connection"),
            ),
            _ => Box::new(
                redis::Client::open(self.primaries()[0].as_str())
                    .and_then(|c| c.get_connection())
                    .expect("data connection"),
            ),
        }
    }
}
