//! The one egress guard: every outbound request the stack makes on a
//! tenant's behalf (result callbacks, `http_request`, approval chat
//! webhooks) is sent through it.
//!
//! - The target's name is resolved by the guard's own resolver, which
//!   refuses the name if any address it resolves to is not public
//!   (`armada_domain::egress::forbidden_ip`); the connection is made to the
//!   addresses it checked, so a second, rebound answer is never used.
//! - An IP literal is checked before anything is sent.
//! - Redirects are never followed (a redirect could leave every list).
//! - No proxy from the environment is used.
//! - Targets the operator lists (`ARMADA_EGRESS_ALLOW`, `host:port` or
//!   `host:*`) may be private; the platform's own endpoints (the AWS
//!   endpoint, the scripted model, the public API) are refused even then.
//!
//! Failures are reported coarsely (`EGRESS_REFUSED`, `CONNECT_FAILED`,
//! `HTTP_<status>`): what a remote said, or how a connection failed, is not
//! handed back to a tenant (it would make the stack a port scanner).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use armada_domain::egress::{forbidden_ip, HostPort};

use crate::config::Config;

/// Why a request did not get an HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EgressError {
    /// The URL is not an http(s) URL with a host.
    InvalidUrl,
    /// The target is not one a tenant may reach.
    Refused,
    /// No connection, or no answer in time.
    ConnectFailed,
}

impl EgressError {
    /// The stable code recorded in events and tool results.
    pub fn code(&self) -> &'static str {
        match self {
            EgressError::InvalidUrl => "INVALID_URL",
            EgressError::Refused => "EGRESS_REFUSED",
            EgressError::ConnectFailed => "CONNECT_FAILED",
        }
    }
}

/// The resolver's refusal, found again in the error chain of a request.
#[derive(Debug)]
struct ResolveRefused;

impl std::fmt::Display for ResolveRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the name resolves to an address tenants may not reach")
    }
}

impl std::error::Error for ResolveRefused {}

/// Resolves with the system resolver and refuses any answer that holds a
/// non-public address.
struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if addrs.is_empty() || addrs.iter().any(|a| forbidden_ip(a.ip()).is_some()) {
                return Err(Box::new(ResolveRefused) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Who may be reached besides the public internet, and what never.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    /// Private targets the operator trusts (`ARMADA_EGRESS_ALLOW`).
    pub allow: Vec<HostPort>,
    /// The platform's own endpoints: never a tenant's target.
    pub never: Vec<HostPort>,
}

impl EgressPolicy {
    /// From `ARMADA_EGRESS_ALLOW` (comma-separated `host:port` / `host:*`)
    /// and the platform's endpoint URLs.
    pub fn new(allow: &[String], platform_urls: &[&str]) -> Result<Self, String> {
        let allow = allow
            .iter()
            .map(|e| HostPort::parse(e, true).ok_or_else(|| format!("'{e}' is not host:port")))
            .collect::<Result<_, _>>()?;
        let never = platform_urls
            .iter()
            .filter_map(|u| reqwest::Url::parse(u).ok())
            .filter_map(|u| {
                Some(HostPort {
                    host: u.host_str()?.trim_matches(['[', ']']).to_ascii_lowercase(),
                    port: Some(u.port_or_known_default()?),
                })
            })
            .collect();
        Ok(EgressPolicy { allow, never })
    }
}

/// The guard: two clients (public targets through the checking resolver,
/// operator-listed ones through the system's) and the policy.
#[derive(Clone)]
pub struct Egress {
    policy: Arc<EgressPolicy>,
    public: reqwest::Client,
    listed: reqwest::Client,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("policy", &self.policy)
            .finish()
    }
}

impl Egress {
    /// The guard a configuration describes (its entries were checked
    /// when it was read).
    pub fn of(cfg: &Config) -> Egress {
        let urls: Vec<&str> = cfg.platform_urls.iter().map(String::as_str).collect();
        let policy = EgressPolicy::new(&cfg.egress_allow, &urls).unwrap_or_default();
        Egress::new(policy)
    }

    pub fn new(policy: EgressPolicy) -> Self {
        let builder = || {
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                .connect_timeout(Duration::from_secs(5))
        };
        Egress {
            policy: Arc::new(policy),
            public: builder()
                .dns_resolver(Arc::new(PublicOnly))
                .build()
                .unwrap_or_default(),
            listed: builder().build().unwrap_or_default(),
        }
    }

    /// A request to `url`, if the URL may be tried at all (its resolved
    /// addresses are checked as it is sent).
    pub fn request(
        &self,
        method: reqwest::Method,
        url: &str,
    ) -> Result<reqwest::RequestBuilder, EgressError> {
        let (url, listed) = self.route(url)?;
        let client = if listed { &self.listed } else { &self.public };
        Ok(client.request(method, url))
    }

    /// The client for requests to `url` alone (its addresses checked as it
    /// connects), for a protocol client that makes its own requests: an
    /// MCP session's.
    pub fn client_for(&self, url: &str) -> Result<reqwest::Client, EgressError> {
        let (_, listed) = self.route(url)?;
        Ok(if listed { &self.listed } else { &self.public }.clone())
    }

    /// What can be judged before sending: the URL's form, an IP literal,
    /// the lists. For refusing bad input early (a name is judged when sent).
    pub fn check(&self, url: &str) -> Result<(), EgressError> {
        self.route(url).map(|_| ())
    }

    /// The parsed URL and whether the operator listed it.
    fn route(&self, url: &str) -> Result<(reqwest::Url, bool), EgressError> {
        let url = reqwest::Url::parse(url).map_err(|_| EgressError::InvalidUrl)?;
        if !matches!(url.scheme(), "http" | "https") || !url.username().is_empty() {
            return Err(EgressError::InvalidUrl);
        }
        let (host, port, default) = url_target(&url).ok_or(EgressError::InvalidUrl)?;
        if self
            .policy
            .never
            .iter()
            .any(|n| n.allows(&host, port, default))
            || self.never_by_address(&host, port)
        {
            return Err(EgressError::Refused);
        }
        if self
            .policy
            .allow
            .iter()
            .any(|a| a.allows(&host, port, default))
        {
            return Ok((url, true));
        }
        if let Ok(ip) = host.trim_matches(['[', ']']).parse::<IpAddr>() {
            if forbidden_ip(ip).is_some() {
                return Err(EgressError::Refused);
            }
        }
        Ok((url, false))
    }

    /// `localhost:4566` is the emulator as much as `127.0.0.1:4566` is.
    fn never_by_address(&self, host: &str, port: u16) -> bool {
        self.policy
            .never
            .iter()
            .any(|n| n.port == Some(port) && this_machine(&n.host) && this_machine(host))
    }

    /// Sends a request made by [`Self::request`]; errors are coarse.
    pub async fn send(req: reqwest::RequestBuilder) -> Result<reqwest::Response, EgressError> {
        req.send().await.map_err(|e| classify(&e))
    }
}

/// An http(s) URL's host, its effective port and its scheme's default
/// port: what allow entries (`host[:port]`) are matched against.
pub fn url_target(url: &reqwest::Url) -> Option<(String, u16, u16)> {
    let default = match url.scheme() {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    let host = url.host_str()?.to_string();
    Some((host, url.port_or_known_default()?, default))
}

fn this_machine(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_matches(['[', ']'])
            .parse::<IpAddr>()
            .is_ok_and(|i| i.is_loopback() || i.is_unspecified())
}

/// `Refused` when the guard's resolver refused the name, else
/// `ConnectFailed` (the detail goes to the log, not to the tenant).
fn classify(e: &reqwest::Error) -> EgressError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<ResolveRefused>() {
            return EgressError::Refused;
        }
        source = s.source();
    }
    tracing::debug!(error = %e, "egress: request failed");
    EgressError::ConnectFailed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(allow: &[&str]) -> Egress {
        let allow: Vec<String> = allow.iter().map(|s| s.to_string()).collect();
        Egress::new(
            EgressPolicy::new(
                &allow,
                &["http://127.0.0.1:4566", "http://localhost:3000/v1"],
            )
            .unwrap(),
        )
    }

    async fn try_get(g: &Egress, url: &str) -> Result<u16, EgressError> {
        let req = g.request(reqwest::Method::GET, url)?;
        Egress::send(req.timeout(Duration::from_secs(2)))
            .await
            .map(|r| r.status().as_u16())
    }

    async fn server() -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 2048];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
                    .await;
            }
        });
        port
    }

    #[tokio::test]
    async fn private_targets_are_refused_by_address_and_by_name() {
        let port = server().await;
        let g = guard(&[]);
        for url in [
            format!("http://127.0.0.1:{port}/"),
            format!("http://localhost:{port}/"),
            format!("http://[::1]:{port}/"),
            format!("http://[::ffff:127.0.0.1]:{port}/"),
            "http://169.254.169.254/latest/meta-data/".to_string(),
            "http://[::ffff:169.254.169.254]/".to_string(),
            "http://0.0.0.0/".to_string(),
            "http://10.0.0.8/".to_string(),
            "http://100.64.1.1/".to_string(),
            "http://[fd12::1]/".to_string(),
        ] {
            assert_eq!(try_get(&g, &url).await, Err(EgressError::Refused), "{url}");
        }
        assert_eq!(
            try_get(&g, "ftp://example.com/").await,
            Err(EgressError::InvalidUrl)
        );
        assert_eq!(
            try_get(&g, "http://u:p@example.com/").await,
            Err(EgressError::InvalidUrl)
        );
    }

    #[tokio::test]
    async fn listed_targets_are_reached_but_never_the_platforms_own() {
        let port = server().await;
        let g = guard(&[&format!("127.0.0.1:{port}")]);
        assert_eq!(
            try_get(&g, &format!("http://127.0.0.1:{port}/x")).await,
            Ok(204)
        );
        let other = server().await;
        assert_eq!(
            try_get(&g, &format!("http://127.0.0.1:{other}/")).await,
            Err(EgressError::Refused),
            "only the listed port"
        );
        let any = guard(&["127.0.0.1:*", "localhost:*"]);
        assert_eq!(
            try_get(&any, &format!("http://127.0.0.1:{other}/")).await,
            Ok(204)
        );
        for url in [
            "http://127.0.0.1:4566/",
            "http://localhost:4566/",
            "http://127.0.0.1:3000/",
            "http://[::1]:4566/",
        ] {
            assert_eq!(try_get(&any, url).await, Err(EgressError::Refused), "{url}");
        }
    }

    #[tokio::test]
    async fn a_closed_port_is_a_coarse_connect_failure() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let g = guard(&["127.0.0.1:*"]);
        assert_eq!(
            try_get(&g, &format!("http://127.0.0.1:{port}/")).await,
            Err(EgressError::ConnectFailed)
        );
    }
}
