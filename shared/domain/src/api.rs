//! What HTTP callers see: stable error codes, request bodies validated field
//! by field, and API keys.

use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::fields::{FieldError, Fields};
use crate::session::OnBusy;

/// An error as answered to a caller: a status, a stable code, a message.
/// Details that would expose internals go to the log, not here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
    pub fn invalid_json(detail: impl std::fmt::Display) -> Self {
        Self::new(
            400,
            "INVALID_JSON",
            format!("the body is not valid JSON: {detail}"),
        )
    }
    pub fn unauthorized() -> Self {
        Self::new(
            401,
            "UNAUTHORIZED",
            "a valid API key is required (Authorization: Bearer <key>)",
        )
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "FORBIDDEN", message)
    }
    pub fn not_found(what: &str) -> Self {
        Self::new(404, "NOT_FOUND", format!("{what} not found"))
    }
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(409, code, message)
    }
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "PAYLOAD_TOO_LARGE",
            format!("the body exceeds {limit} bytes"),
        )
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "UNAVAILABLE", message)
    }
    pub fn internal() -> Self {
        Self::new(500, "INTERNAL", "internal error; it has been logged")
    }
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {"code": self.code, "message": self.message}})
    }
}

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        ApiError::new(400, "INVALID_FIELD", e.to_string())
    }
}

/// `POST /v1/runs`.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateRun {
    pub agent: String,
    pub input: String,
    pub session_id: Option<String>,
    pub callback_url: Option<String>,
    pub metadata: serde_json::Value,
}

/// Inputs are bounded by the body limit; above the inline limit they are
/// stored in S3 and referenced.
pub const MAX_INPUT_CHARS: usize = 1_000_000;

fn check_input(input: &str) -> Result<(), FieldError> {
    if input.trim().is_empty() {
        return Err(FieldError::new("input", "must not be empty"));
    }
    if input.chars().count() > MAX_INPUT_CHARS {
        return Err(FieldError::new(
            "input",
            &format!("must be at most {MAX_INPUT_CHARS} characters"),
        ));
    }
    Ok(())
}

impl CreateRun {
    pub fn parse(body: &serde_json::Value) -> Result<Self, FieldError> {
        let f = Fields::new(body)?;
        f.only(&["agent", "input", "session_id", "callback_url", "metadata"])?;
        let agent = f.req_str("agent")?.to_string();
        let input = f.req_str("input")?.to_string();
        check_input(&input)?;
        let session_id = f.opt_str("session_id")?.map(str::to_string);
        let callback_url = f.opt_str("callback_url")?.map(str::to_string);
        if let Some(u) = &callback_url {
            if !(u.starts_with("https://") || u.starts_with("http://")) || u.len() > 2048 {
                return Err(FieldError::new("callback_url", "must be an http(s) URL"));
            }
        }
        let metadata = match f.opt_obj("metadata")? {
            Some(m) => serde_json::Value::Object(m.clone()),
            None => serde_json::json!({}),
        };
        if metadata.to_string().len() > 8192 {
            return Err(FieldError::new(
                "metadata",
                "must be at most 8192 bytes of JSON",
            ));
        }
        Ok(CreateRun {
            agent,
            input,
            session_id,
            callback_url,
            metadata,
        })
    }
}

/// `POST /v1/sessions`.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateSession {
    pub agent: String,
    pub on_busy: OnBusy,
}

impl CreateSession {
    pub fn parse(body: &serde_json::Value) -> Result<Self, FieldError> {
        let f = Fields::new(body)?;
        f.only(&["agent", "on_busy"])?;
        let agent = f.req_str("agent")?.to_string();
        let on_busy = match f.opt_str("on_busy")? {
            None => OnBusy::Queue,
            Some(s) => OnBusy::parse(s)
                .ok_or_else(|| FieldError::new("on_busy", "must be \"queue\" or \"reject\""))?,
        };
        Ok(CreateSession { agent, on_busy })
    }
}

/// `POST /v1/sessions/{id}/messages`.
pub fn parse_message(body: &serde_json::Value) -> Result<String, FieldError> {
    let f = Fields::new(body)?;
    f.only(&["input"])?;
    let input = f.req_str("input")?.to_string();
    check_input(&input)?;
    Ok(input)
}

/// An API key as shown once to its owner: `ak_<key_id>_<secret>`. Only the
/// secret's SHA-256 is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub key_id: String,
    pub secret: String,
}

impl ApiKey {
    pub fn mint() -> Self {
        let mut id = [0u8; 8];
        let mut secret = [0u8; 24];
        rand::thread_rng().fill_bytes(&mut id);
        rand::thread_rng().fill_bytes(&mut secret);
        ApiKey {
            key_id: hex::encode(id),
            secret: hex::encode(secret),
        }
    }

    pub fn token(&self) -> String {
        format!("ak_{}_{}", self.key_id, self.secret)
    }

    pub fn parse(token: &str) -> Option<Self> {
        let rest = token.strip_prefix("ak_")?;
        let (id, secret) = rest.split_once('_')?;
        let hexy = |s: &str, n: usize| s.len() == n && s.chars().all(|c| c.is_ascii_hexdigit());
        (hexy(id, 16) && hexy(secret, 48)).then(|| ApiKey {
            key_id: id.to_string(),
            secret: secret.to_string(),
        })
    }

    pub fn secret_hash(&self) -> String {
        sha256_hex(self.secret.as_bytes())
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// HMAC-SHA256 (RFC 2104), hex-encoded.
pub fn hmac_sha256_hex(key: &[u8], message: &[u8]) -> String {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(message);
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    hex::encode(outer.finalize())
}

/// The `X-Armada-Signature` of a callback: `t=<unix seconds>,v1=<hex>` over
/// `"<t>.<body>"`, so a receiver can refuse replays of old deliveries.
pub fn callback_signature(secret: &str, timestamp_s: i64, body: &str) -> String {
    let mac = hmac_sha256_hex(
        secret.as_bytes(),
        format!("{timestamp_s}.{body}").as_bytes(),
    );
    format!("t={timestamp_s},v1={mac}")
}

/// Compares two hex digests without an early exit.
pub fn digest_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

pub fn valid_tenant(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 64
        && t.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn create_run_names_bad_fields() {
        assert_eq!(
            CreateRun::parse(&json!({"input": "x"})).unwrap_err().field,
            "agent"
        );
        assert_eq!(
            CreateRun::parse(&json!({"agent": 5, "input": "x"}))
                .unwrap_err()
                .field,
            "agent"
        );
        assert_eq!(
            CreateRun::parse(&json!({"agent": "a", "input": "x", "callback_url": "ftp://x"}))
                .unwrap_err()
                .field,
            "callback_url"
        );
        assert_eq!(
            CreateRun::parse(&json!({"agent": "a", "input": "x", "extra": 1}))
                .unwrap_err()
                .field,
            "extra"
        );
        assert_eq!(CreateRun::parse(&json!([1])).unwrap_err().field, "body");
        assert!(CreateRun::parse(&json!({"agent": "a", "input": "x"})).is_ok());
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        assert_eq!(
            hmac_sha256_hex(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn keys_round_trip_and_hash() {
        let k = ApiKey::mint();
        let parsed = ApiKey::parse(&k.token()).unwrap();
        assert_eq!(parsed, k);
        assert!(digest_eq(&parsed.secret_hash(), &k.secret_hash()));
        assert!(ApiKey::parse("ak_zz_yy").is_none());
        assert!(!digest_eq("ab", "ac"));
    }
}
