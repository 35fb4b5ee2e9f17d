//! What HTTP callers send, validated field by field, and API keys (the
//! errors they are answered with are `armada-api`'s).

use crate::crypto::{hmac_sha256_hex, sha256_hex};
use rand::RngCore;

use crate::fields::{FieldError, Fields};
use crate::session::OnBusy;

/// The one-minute window `now_ms` falls in (its start, in seconds since
/// the epoch) and how many seconds remain of it (at least 1).
pub fn minute_window(now_ms: i64) -> (i64, u32) {
    let now_s = now_ms.div_euclid(1000);
    let start = now_s - now_s.rem_euclid(60);
    (
        start,
        u32::try_from(start + 60 - now_s).unwrap_or(60).max(1),
    )
}

/// `POST /v1/runs`.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateRun {
    pub target: RunTarget,
    pub input: String,
    pub session_id: Option<String>,
    pub callback_url: Option<String>,
    pub metadata: serde_json::Value,
    /// What starts it when not a key (a hook's delivery): set by the
    /// stack, never read from a body.
    pub started_from: Option<crate::run::Trigger>,
}

/// Who a new Run is for (stored as `{"agent": name}`, `{"team": name}`
/// or `{"chain": [names]}`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunTarget {
    Agent(String),
    /// A team from the registry (fan-out, relay or lead).
    Team(String),
    /// A sequential relay of these agents, each given the previous output.
    Chain(Vec<String>),
}

/// The most steps a relay chain may have.
pub const MAX_CHAIN_STEPS: usize = 16;

/// A message that begins with a mention addresses it: `@team:<name> ...`
/// a team, `@<agent> ...` an agent. The mention is stripped from the input;
/// `None` when the message begins with no (well-formed) mention.
pub fn parse_mention(input: &str) -> Option<(RunTarget, String)> {
    let rest = input.trim_start().strip_prefix('@')?;
    let (word, text) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let text = text.trim_start().to_string();
    let (target, name) = match word.strip_prefix("team:") {
        Some(team) => (RunTarget::Team(team.to_string()), team),
        None => (RunTarget::Agent(word.to_string()), word),
    };
    (crate::names::valid_name(name) && !text.trim().is_empty()).then_some((target, text))
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

pub(crate) fn parse_target(f: &Fields<'_>, input: &mut String) -> Result<RunTarget, FieldError> {
    let name = |key: &str| -> Result<Option<String>, FieldError> {
        match f.opt_str(key)? {
            Some(n) if !crate::names::valid_name(n) => Err(FieldError::new(
                key,
                "must be 1-64 characters of a-z, 0-9, '-' or '_'",
            )),
            other => Ok(other.map(str::to_string)),
        }
    };
    let agent = name("agent")?;
    let team = name("team")?;
    let chain = f.opt_str_list("chain")?;
    let given = [agent.is_some(), team.is_some(), chain.is_some()];
    if given.iter().filter(|g| **g).count() > 1 {
        let second = ["agent", "team", "chain"]
            .into_iter()
            .zip(given)
            .filter(|(_, g)| *g)
            .nth(1)
            .map_or("team", |(k, _)| k);
        return Err(FieldError::new(second, "give one of agent, team or chain"));
    }
    if let Some(steps) = chain {
        if steps.is_empty() || steps.len() > MAX_CHAIN_STEPS {
            return Err(FieldError::new(
                "chain",
                &format!("must name between 1 and {MAX_CHAIN_STEPS} agents"),
            ));
        }
        for (i, a) in steps.iter().enumerate() {
            if !crate::names::valid_name(a) {
                return Err(FieldError::new(
                    &format!("chain[{i}]"),
                    "is not a valid agent name",
                ));
            }
        }
        return Ok(RunTarget::Chain(steps));
    }
    if let Some(a) = agent {
        return Ok(RunTarget::Agent(a));
    }
    if let Some(t) = team {
        return Ok(RunTarget::Team(t));
    }
    match parse_mention(input) {
        Some((target, text)) => {
            *input = text;
            Ok(target)
        }
        None => Err(FieldError::new(
            "agent",
            "is required (or team, or chain, or an input that begins with @agent or @team:name)",
        )),
    }
}

impl CreateRun {
    pub fn parse(body: &serde_json::Value) -> Result<Self, FieldError> {
        let f = Fields::new(body)?;
        f.only(&[
            "agent",
            "team",
            "chain",
            "input",
            "session_id",
            "callback_url",
            "metadata",
        ])?;
        let mut input = f.req_str("input")?.to_string();
        check_input(&input)?;
        let target = parse_target(&f, &mut input)?;
        let session_id = f.opt_str("session_id")?.map(str::to_string);
        if session_id.is_some() && !matches!(target, RunTarget::Agent(_)) {
            return Err(FieldError::new(
                "session_id",
                "a session belongs to one agent: team and chain runs take none",
            ));
        }
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
            target,
            input,
            session_id,
            callback_url,
            metadata,
            started_from: None,
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

/// What a tenant key may do besides the tenant's runs and sessions:
/// an `approver` key also decides the tenant's approvals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyRole {
    #[default]
    Member,
    Approver,
}

impl KeyRole {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyRole::Member => "member",
            KeyRole::Approver => "approver",
        }
    }

    pub fn parse(s: &str) -> Option<KeyRole> {
        match s {
            "member" => Some(KeyRole::Member),
            "approver" => Some(KeyRole::Approver),
            _ => None,
        }
    }
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

/// The `X-Armada-Signature` of a callback: `t=<unix seconds>,v1=<hex>` over
/// `"<t>.<body>"`, so a receiver can refuse replays of old deliveries.
pub fn callback_signature(secret: &str, timestamp_s: i64, body: &str) -> String {
    let mac = hmac_sha256_hex(
        secret.as_bytes(),
        format!("{timestamp_s}.{body}").as_bytes(),
    );
    format!("t={timestamp_s},v1={mac}")
}

/// What a signed delivery to a tenant's endpoint is. Each kind has its own
/// key, so a receiver that checks one kind never accepts the other: a chat
/// endpoint that replays an approval's chat message to the tenant's
/// callback receiver is refused there, however it frames the headers and
/// the body (a type inside the signed string would hold only against
/// receivers that parse the timestamp strictly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// A Run's outcome to its `callback_url`, signed per Standard Webhooks
    /// with the tenant's callback secret (`crypto::standard_signature`).
    Callback,
    /// An approval's message to its `chat_webhook_url`, signed with
    /// [`chat_signing_secret`].
    ChatMessage,
}

impl Delivery {
    /// The `X-Armada-Signature` of this kind of delivery of `body`, for
    /// the tenant whose callback secret is `tenant_secret`.
    pub fn signature(self, tenant_secret: &str, timestamp_s: i64, body: &str) -> String {
        match self {
            Delivery::Callback => callback_signature(tenant_secret, timestamp_s, body),
            Delivery::ChatMessage => {
                callback_signature(&chat_signing_secret(tenant_secret), timestamp_s, body)
            }
        }
    }
}

/// The key a tenant's chat messages are signed with: the hex HMAC-SHA256
/// of `armada-chat-webhook` keyed with the tenant's callback secret. The
/// tenant computes it from the secret it was shown; rotating that secret
/// rotates this one.
pub fn chat_signing_secret(tenant_secret: &str) -> String {
    hmac_sha256_hex(tenant_secret.as_bytes(), b"armada-chat-webhook")
}

/// A tenant's callback signing secret: derived from the deployment's
/// secret, the tenant and the salt of its last rotation (`""` before the
/// first), so the secret itself is stored nowhere; only the salt is, and it
/// is worthless without the deployment secret. Tenant A's secret says
/// nothing about tenant B's.
pub fn tenant_callback_secret(deployment_secret: &str, tenant: &str, salt: &str) -> String {
    let mac = hmac_sha256_hex(
        deployment_secret.as_bytes(),
        format!("armada-callback-secret\n{tenant}\n{salt}").as_bytes(),
    );
    format!("whsec_{mac}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::digest_eq;
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
        let cases = [
            (json!({"agent": "a", "team": "t", "input": "x"}), "team"),
            (json!({"team": "t", "chain": ["a"], "input": "x"}), "chain"),
            (json!({"chain": [], "input": "x"}), "chain"),
            (json!({"chain": ["a", "B"], "input": "x"}), "chain[1]"),
            (json!({"chain": vec!["a"; 17], "input": "x"}), "chain"),
            (
                json!({"team": "t", "session_id": "s", "input": "x"}),
                "session_id",
            ),
            (json!({"input": "@ nobody"}), "agent"),
        ];
        for (body, field) in cases {
            assert_eq!(CreateRun::parse(&body).unwrap_err().field, field, "{body}");
        }
    }

    #[test]
    fn a_mention_at_the_start_addresses_a_team_or_an_agent() {
        let cr = CreateRun::parse(&json!({"input": "  @team:soc look at alert 7"})).unwrap();
        assert_eq!(cr.target, RunTarget::Team("soc".into()));
        assert_eq!(cr.input, "look at alert 7");
        let cr = CreateRun::parse(&json!({"input": "@coder fix it"})).unwrap();
        assert_eq!(cr.target, RunTarget::Agent("coder".into()));
        assert_eq!(cr.input, "fix it");
        // With an agent named, the text is left as it is.
        let cr = CreateRun::parse(&json!({"agent": "a", "input": "@coder fix it"})).unwrap();
        assert_eq!(
            (cr.target, cr.input.as_str()),
            (RunTarget::Agent("a".into()), "@coder fix it")
        );
        assert_eq!(
            parse_mention("@team:soc"),
            None,
            "a mention alone asks nothing"
        );
        assert_eq!(parse_mention("mail @coder"), None);
        let cr = CreateRun::parse(&json!({"chain": ["r", "w"], "input": "x"})).unwrap();
        assert_eq!(cr.target, RunTarget::Chain(vec!["r".into(), "w".into()]));
    }

    #[test]
    fn tenants_have_secrets_of_their_own_that_rotation_changes() {
        let a = tenant_callback_secret("deployment secret", "a", "");
        assert_eq!(a, tenant_callback_secret("deployment secret", "a", ""));
        assert_ne!(a, tenant_callback_secret("deployment secret", "b", ""));
        assert_ne!(a, tenant_callback_secret("deployment secret", "a", "s1"));
        assert_ne!(a, tenant_callback_secret("another deployment", "a", ""));
        assert!(a.starts_with("whsec_") && a.len() == 6 + 64);
    }

    /// What a callback receiver does (README): `t` and `v1` from the
    /// header, the HMAC of `"<t>.<body>"` with the tenant's secret.
    fn callback_receiver_accepts(secret: &str, header: &str, body: &str) -> bool {
        let Some((t, mac)) = header.strip_prefix("t=").and_then(|h| h.split_once(",v1=")) else {
            return false;
        };
        digest_eq(
            mac,
            &hmac_sha256_hex(secret.as_bytes(), format!("{t}.{body}").as_bytes()),
        )
    }

    #[test]
    fn a_chat_message_never_verifies_as_a_callback() {
        let secret = tenant_callback_secret("deployment secret", "acme", "s1");
        let body = r#"{"text":"Approval needed","tenant":"acme"}"#;
        // Callbacks are signed as they always were.
        let callback = Delivery::Callback.signature(&secret, 1_700_000_000, body);
        assert_eq!(callback, callback_signature(&secret, 1_700_000_000, body));
        assert_eq!(
            callback,
            format!(
                "t=1700000000,v1={}",
                hmac_sha256_hex(secret.as_bytes(), format!("1700000000.{body}").as_bytes())
            )
        );
        assert!(callback_receiver_accepts(&secret, &callback, body));
        // A chat message replayed to the callback receiver, as sent or
        // with its timestamp moved into the body, is refused there.
        let chat = Delivery::ChatMessage.signature(&secret, 1_700_000_000, body);
        let mac = chat.split_once(",v1=").map(|(_, m)| m).unwrap_or_default();
        for (header, replayed) in [
            (chat.clone(), body.to_string()),
            (format!("t=,v1={mac}"), format!("1700000000.{body}")),
        ] {
            assert!(!callback_receiver_accepts(&secret, &header, &replayed));
        }
        // The chat endpoint verifies with its own key, derived from the
        // tenant's secret.
        assert!(callback_receiver_accepts(
            &chat_signing_secret(&secret),
            &chat,
            body
        ));
        assert_ne!(
            chat_signing_secret(&secret),
            chat_signing_secret(&tenant_callback_secret("deployment secret", "acme", "s2"))
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
