//! What an outbound request made on a tenant's behalf may reach: the rules
//! behind the one egress guard (`armada_core::services::egress`) that callbacks,
//! `http_request` and chat webhooks all go through.
//!
//! Two lists decide. An agent's `http_allow_hosts` (entries `host[:port]`,
//! the port defaulting to the URL scheme's) says which hosts its skill may
//! call at all. Then every address a target resolves to must be public:
//! loopback, private, link-local, unique-local, shared (CGNAT), multicast,
//! unspecified, IPv4-mapped and NAT64/6to4 forms of those, Teredo,
//! IPv4-translated and local-use NAT64 are refused, unless the operator
//! listed the target (`ARMADA_EGRESS_ALLOW`); the platform's own endpoints
//! are refused even then.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::fields::FieldError;

/// A `host[:port]` entry; `port: None` is the URL scheme's default port,
/// `Some(0)` (written `host:*`) any port (operator lists only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    pub host: String,
    pub port: Option<u16>,
}

impl HostPort {
    /// Parses `host`, `host:port`, `[v6]:port` or (with `wildcard`) `host:*`.
    pub fn parse(entry: &str, wildcard: bool) -> Option<HostPort> {
        let entry = entry.trim();
        if entry.is_empty() || entry.contains(['/', '@', '?', '#', ' ']) {
            return None;
        }
        let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
            let (h, tail) = rest.split_once(']')?;
            h.parse::<Ipv6Addr>().ok()?;
            (h, tail.strip_prefix(':'))
        } else {
            match entry.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => (h, Some(p)),
                Some(_) => return None,
                None => (entry, None),
            }
        };
        if host.is_empty() {
            return None;
        }
        let port = match port {
            None => None,
            Some("*") if wildcard => Some(0),
            Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p != 0)?),
        };
        Some(HostPort {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// Whether this entry allows `host` on `port`, the URL's effective port
    /// (`default` is its scheme's).
    pub fn allows(&self, host: &str, port: u16, default: u16) -> bool {
        let host = host.trim_matches(['[', ']']);
        self.host.eq_ignore_ascii_case(host)
            && match self.port {
                Some(0) => true,
                Some(p) => p == port,
                None => port == default,
            }
    }
}

/// Checks an agent's `http_allow_hosts` as written.
pub fn parse_allow_hosts(entries: &[String]) -> Result<Vec<HostPort>, FieldError> {
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            HostPort::parse(e, false).ok_or_else(|| {
                FieldError::new(
                    &format!("http_allow_hosts[{i}]"),
                    "must be host or host:port (no scheme, path or wildcard)",
                )
            })
        })
        .collect()
}

/// Headers an agent's `http_request` sends to one host of its allow-list
/// whatever the model asks for: a token the platform holds for the tenant
/// (`{"secret": "<name>"}`, opened in the harness as the request goes), or
/// a value written out. The model never sees them.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HttpHeaders {
    /// `host[:port]`, as on `http_allow_hosts` (where it must be).
    pub host: String,
    pub headers: std::collections::BTreeMap<String, crate::secret::Configured>,
}

/// How many hosts an agent fixes headers for, and headers per host.
pub const MAX_HTTP_HEADER_HOSTS: usize = 16;
pub const MAX_HTTP_HEADERS: usize = 16;

/// Headers `http_request` sets itself, which no rule may replace.
const OWN_HEADERS: [&str; 5] = [
    "idempotency-key",
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
];

/// Checks an agent's `http_headers` as written (`allow` its allow-list,
/// checked): each host allowed, each header a token, each value one a
/// header may carry.
pub fn parse_http_headers(
    v: &serde_json::Value,
    allow: &[HostPort],
) -> Result<Vec<HttpHeaders>, FieldError> {
    let list = v
        .as_array()
        .ok_or_else(|| FieldError::new("http_headers", "must be a list of {host, headers}"))?;
    if list.len() > MAX_HTTP_HEADER_HOSTS {
        return Err(FieldError::new(
            "http_headers",
            &format!("at most {MAX_HTTP_HEADER_HOSTS} hosts"),
        ));
    }
    let mut rules: Vec<HttpHeaders> = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let at = format!("http_headers[{i}]");
        let obj = item
            .as_object()
            .ok_or_else(|| FieldError::new(&at, "must be {host, headers}"))?;
        let f = crate::fields::Fields::nested(obj, &at)?;
        f.only(&["host", "headers"])?;
        let host = f.req_str("host")?;
        let parsed = HostPort::parse(host, false)
            .filter(|h| allow.contains(h))
            .ok_or_else(|| {
                FieldError::new(
                    &format!("{at}.host"),
                    "must be an entry of http_allow_hosts",
                )
            })?;
        if rules
            .iter()
            .any(|r| HostPort::parse(&r.host, false) == Some(parsed.clone()))
        {
            return Err(FieldError::new(&format!("{at}.host"), "is named twice"));
        }
        let headers = parse_header_map(&format!("{at}.headers"), f.req_obj("headers")?, &[])?;
        rules.push(HttpHeaders {
            host: host.to_string(),
            headers,
        });
    }
    Ok(rules)
}

/// Headers as a definition fixes them (`{"Name": "value" | {"secret":
/// name}}`, errors naming `field`): 1 to [`MAX_HTTP_HEADERS`] of them,
/// each name a token that neither the request's own headers nor
/// `reserved` (lowercase) hold, each written value one a header may carry.
pub fn parse_header_map(
    field: &str,
    given: &serde_json::Map<String, serde_json::Value>,
    reserved: &[&str],
) -> Result<std::collections::BTreeMap<String, crate::secret::Configured>, FieldError> {
    if given.is_empty() || given.len() > MAX_HTTP_HEADERS {
        return Err(FieldError::new(
            field,
            &format!("must have 1 to {MAX_HTTP_HEADERS} headers"),
        ));
    }
    let mut headers = std::collections::BTreeMap::new();
    for (name, value) in given {
        let at = format!("{field}.{name}");
        let token = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        let lower = name.to_ascii_lowercase();
        if !token || OWN_HEADERS.contains(&lower.as_str()) || reserved.contains(&lower.as_str()) {
            return Err(FieldError::new(&at, "is not a header name a rule may set"));
        }
        let value = crate::secret::Configured::parse(&at, value)?;
        if let crate::secret::Configured::Literal(text) = &value {
            if text.bytes().any(|b| b != b'\t' && (b < 0x20 || b == 0x7f)) {
                return Err(FieldError::new(&at, "has characters a header cannot carry"));
            }
        }
        headers.insert(name.clone(), value);
    }
    Ok(headers)
}

/// Why an address is never a tenant's target, or `None` if it is public.
pub fn forbidden_ip(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    let why = if o[0] == 0 {
        "unspecified"
    } else if ip.is_loopback() {
        "loopback"
    } else if ip.is_private() {
        "private"
    } else if ip.is_link_local() {
        "link-local"
    } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
        "shared address space"
    } else if o[0] == 192 && o[1] == 0 && o[2] == 0 {
        "protocol assignments"
    } else if o[0] == 198 && (o[1] & 0xfe) == 18 {
        "benchmarking"
    } else if ip.is_multicast() || o[0] >= 240 {
        "multicast or reserved"
    } else {
        return None;
    };
    Some(why)
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    // IPv4-mapped and -compatible forms are refused outright (a public
    // IPv4 target is reached as IPv4); well-known NAT64 and 6to4 are
    // judged by the IPv4 address they carry. Teredo, IPv4-translated
    // (SIIT) and local-use NAT64 are refused whatever they carry: each
    // reaches an IPv4 host through a relay or translator the operator
    // picks, so the carried address says nothing about where the packet
    // ends up, and no public service needs to be reached that way.
    let embedded =
        |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return forbidden_v4(v4).or(Some("IPv4-mapped"));
    }
    let why = if ip.is_unspecified() {
        "unspecified"
    } else if ip.is_loopback() {
        "loopback"
    } else if s[0..6] == [0; 6] {
        // ::a.b.c.d, deprecated IPv4-compatible.
        return forbidden_v4(embedded(s[6], s[7])).or(Some("IPv4-compatible"));
    } else if s[0..4] == [0; 4] && s[4] == 0xffff && s[5] == 0 {
        // ::ffff:0:a.b.c.d (RFC 2765).
        "IPv4-translated"
    } else if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
        // 64:ff9b:1::/48 (RFC 8215), a network's own translators.
        "local-use NAT64"
    } else if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0; 4] {
        // 64:ff9b::/96 (RFC 6052).
        return forbidden_v4(embedded(s[6], s[7]));
    } else if s[0] == 0x64 && s[1] == 0xff9b {
        // The rest of 64:ff9b::/32 is unassigned.
        "reserved NAT64"
    } else if s[0] == 0x2001 && s[1] == 0 {
        // 2001::/32 (RFC 4380).
        "Teredo"
    } else if s[0] == 0x2002 {
        return forbidden_v4(embedded(s[1], s[2]));
    } else if (s[0] & 0xfe00) == 0xfc00 {
        "unique-local"
    } else if (s[0] & 0xffc0) == 0xfe80 || (s[0] & 0xffc0) == 0xfec0 {
        "link-local"
    } else if (s[0] & 0xff00) == 0xff00 {
        "multicast"
    } else {
        return None;
    };
    Some(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(ip: &str) -> bool {
        forbidden_ip(ip.parse().unwrap()).is_some()
    }

    #[test]
    fn every_non_public_address_is_refused() {
        for ip in [
            "127.0.0.1",
            "127.8.9.10",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.254",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.0.170",
            "198.18.0.1",
            "::",
            "::1",
            "::ffff:169.254.169.254",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:93.184.216.34",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a9fe:a9fe",
            "64:ff9b:1::808:808",
            "64:ff9b:1:ffff::1",
            "64:ff9b:2::808:808",
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "::ffff:0:7f00:1",
            "::ffff:0:808:808",
            "2002:7f00:1::",
            "fd00::1",
            "fd12:3456::1",
            "fc00::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(refused(ip), "{ip} must be refused");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for ip in [
            "93.184.216.34",
            "8.8.8.8",
            "100.128.0.1",
            "172.32.0.1",
            "2606:2800:220:1:248:1893:25c8:1946",
            "2001:4860:4860::8888",
            "2001:500:2f::f",
            "64:ff9b::808:808",
        ] {
            assert!(!refused(ip), "{ip} is public");
        }
    }

    #[test]
    fn allow_entries_match_host_and_port_defaulting_to_the_schemes() {
        let e = HostPort::parse("Example.com", false).unwrap();
        assert!(e.allows("example.com", 443, 443));
        assert!(e.allows("example.com", 80, 80));
        assert!(!e.allows("example.com", 4566, 80), "not every port");
        let p = HostPort::parse("127.0.0.1:8080", false).unwrap();
        assert!(p.allows("127.0.0.1", 8080, 80));
        assert!(!p.allows("127.0.0.1", 4566, 80));
        let v6 = HostPort::parse("[::1]:9000", false).unwrap();
        assert!(v6.allows("[::1]", 9000, 80));
        let any = HostPort::parse("127.0.0.1:*", true).unwrap();
        assert!(any.allows("127.0.0.1", 4566, 80));
        assert!(HostPort::parse("127.0.0.1:*", false).is_none());
        for bad in ["", "http://x", "x/y", "x:0", "x:99999", "::1", "u@x", ":80"] {
            assert!(HostPort::parse(bad, false).is_none(), "{bad}");
        }
        let err = parse_allow_hosts(&["ok.com".into(), "https://x".into()]).unwrap_err();
        assert_eq!(err.field, "http_allow_hosts[1]");
    }

    #[test]
    fn header_rules_name_allowed_hosts_tokens_and_values_or_secrets() {
        use serde_json::json;
        let allow = parse_allow_hosts(&["crm.example".into(), "127.0.0.1:8080".into()]).unwrap();
        let rules = parse_http_headers(
            &json!([
                {"host": "crm.example", "headers": {"Authorization": {"secret": "crm-token"}, "X-Team": "blue"}},
                {"host": "127.0.0.1:8080", "headers": {"X-Key": {"secret": "k"}}}
            ]),
            &allow,
        )
        .unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(
            rules[0].headers["Authorization"].secret(),
            Some("crm-token")
        );
        let cases = [
            (json!({}), "http_headers"),
            (
                json!([{"host": "other.example", "headers": {"A": "b"}}]),
                "http_headers[0].host",
            ),
            (
                json!([{"host": "crm.example", "headers": {}}]),
                "http_headers[0].headers",
            ),
            (
                json!([{"host": "crm.example", "headers": {"Bad Name": "x"}}]),
                "http_headers[0].headers.Bad Name",
            ),
            (
                json!([{"host": "crm.example", "headers": {"Idempotency-Key": "x"}}]),
                "http_headers[0].headers.Idempotency-Key",
            ),
            (
                json!([{"host": "crm.example", "headers": {"A": "x\r\nB: y"}}]),
                "http_headers[0].headers.A",
            ),
            (
                json!([{"host": "crm.example", "headers": {"A": {"secret": "No Such"}}}]),
                "http_headers[0].headers.A.secret",
            ),
            (
                json!([{"host": "crm.example", "headers": {"A": "x"}, "x": 1}]),
                "http_headers[0].x",
            ),
            (
                json!([{"host": "crm.example", "headers": {"A": "x"}}, {"host": "CRM.example", "headers": {"A": "x"}}]),
                "http_headers[1].host",
            ),
        ];
        for (v, field) in cases {
            let e = parse_http_headers(&v, &allow).unwrap_err();
            assert_eq!(e.field, field, "{v}");
        }
    }
}
