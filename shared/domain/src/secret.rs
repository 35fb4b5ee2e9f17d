//! Tenants' secrets (`/v1/secrets`): values a tenant's tools are given (a
//! token an `http_request` header carries, an MCP server's bearer, a
//! sandbox program's environment) that nobody reads back. A secret is
//! stored sealed ([`Sealed`]: AES-256-GCM, bound to its tenant and name),
//! changes only through its machine, and is opened only by the function
//! that makes the call needing it; where a value would be recorded (a
//! tool's result) a [`Scrubber`] puts `[secret:name]` in its place.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::fields::FieldError;
use crate::machine::Machine;
use crate::names::valid_name;

/// The longest value a secret holds (a private key in PEM fits).
pub const MAX_VALUE_BYTES: usize = 8 * 1024;
/// The shortest: a shorter value could not be told from ordinary text
/// where it is scrubbed from what is recorded.
pub const MIN_VALUE_BYTES: usize = 4;
/// How many secrets one tenant may hold.
pub const MAX_PER_TENANT: usize = 200;

/// A secret's value in the clear: only ever in the memory of the call that
/// uses it; its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    /// A `PUT`'s value, checked (field `value`).
    pub fn parse(body: &Value) -> Result<SecretValue, FieldError> {
        let f = crate::fields::Fields::new(body)?;
        f.only(&["value"])?;
        let value = f.req_str("value")?;
        if value.len() < MIN_VALUE_BYTES || value.len() > MAX_VALUE_BYTES {
            return Err(FieldError::new(
                "value",
                &format!("must be {MIN_VALUE_BYTES} to {MAX_VALUE_BYTES} bytes"),
            ));
        }
        Ok(SecretValue(value.to_string()))
    }

    pub fn new(value: String) -> SecretValue {
        SecretValue(value)
    }

    /// The value itself, for the request that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(..)")
    }
}

/// Whether `name` can name a secret (as agents and skills are named).
pub fn check_name(name: &str) -> Result<(), FieldError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(FieldError::new(
            "name",
            "must be 1-64 characters of a-z, 0-9, '-' or '_', beginning with a letter or digit",
        ))
    }
}

/// A sealed value, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    /// Which key sealed it: [`DERIVED_KEY`] (the deployment secret's) or
    /// the ARN of the KMS key that wrapped its data key.
    pub key: String,
    /// Its data key as KMS wrapped it (base64); none under a derived key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrapped_key: Option<String>,
    /// Nonce, ciphertext and tag (base64).
    pub value: String,
}

/// [`Sealed::key`] of a value sealed under the key derived from the
/// deployment secret (the local stack's).
pub const DERIVED_KEY: &str = "derived:v1";

/// What a sealed value is bound to (AES-GCM's associated data, KMS's
/// encryption context): moved to another tenant or name, it opens no more.
pub fn binding(tenant: &str, name: &str) -> String {
    format!("armada-secret\n{tenant}\n{name}")
}

/// A tenant's secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Secret {
    pub tenant: String,
    pub name: String,
    sealed: Sealed,
    state: SecretState,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// Incremented by every write; every write is conditional on it.
    pub version: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SecretState {
    Live,
    /// Deleted: the store removes it.
    Deleted,
}

/// What a secret is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretEvent {
    /// A new value, sealed.
    Put(Sealed),
    Delete,
}

/// Nothing follows a secret's change but its write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretAction {}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretRefusal {
    #[error("the secret was deleted")]
    Deleted,
}

impl Secret {
    /// A secret put for the first time.
    pub fn new(tenant: &str, name: &str, sealed: Sealed, now_ms: i64) -> Secret {
        Secret {
            tenant: tenant.to_string(),
            name: name.to_string(),
            sealed,
            state: SecretState::Live,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            version: 1,
        }
    }

    pub fn state(&self) -> SecretState {
        self.state
    }

    pub fn sealed(&self) -> &Sealed {
        &self.sealed
    }
}

impl Machine for Secret {
    type Event = SecretEvent;
    type Action = SecretAction;
    type Refusal = SecretRefusal;
    type Version = u64;

    fn apply(
        &mut self,
        event: SecretEvent,
        now_ms: i64,
    ) -> Result<Vec<SecretAction>, SecretRefusal> {
        if self.state == SecretState::Deleted {
            return Err(SecretRefusal::Deleted);
        }
        match event {
            SecretEvent::Put(sealed) => self.sealed = sealed,
            SecretEvent::Delete => self.state = SecretState::Deleted,
        }
        self.updated_at_ms = now_ms.max(self.updated_at_ms);
        self.version += 1;
        Ok(vec![])
    }

    fn version(&self) -> u64 {
        self.version
    }
}

/// A value configured where a header or a token goes: written out, or a
/// secret of the tenant's named (`{"secret": "crm-token"}`).
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Configured {
    Secret { secret: String },
    Literal(String),
}

impl Configured {
    /// `field`'s value: a string, or an object of one `secret` naming one.
    pub fn parse(field: &str, v: &Value) -> Result<Configured, FieldError> {
        match v {
            Value::String(s) => Ok(Configured::Literal(s.clone())),
            Value::Object(o) => {
                let name = match (o.len(), o.get("secret")) {
                    (1, Some(Value::String(n))) => n,
                    _ => {
                        return Err(FieldError::new(
                            field,
                            "must be a string or {\"secret\": \"<name>\"}",
                        ))
                    }
                };
                check_name(name).map_err(|_| {
                    FieldError::new(&format!("{field}.secret"), "is not a secret's name")
                })?;
                Ok(Configured::Secret {
                    secret: name.clone(),
                })
            }
            _ => Err(FieldError::new(
                field,
                "must be a string or {\"secret\": \"<name>\"}",
            )),
        }
    }

    /// The secret it names, if it names one.
    pub fn secret(&self) -> Option<&str> {
        match self {
            Configured::Secret { secret } => Some(secret),
            Configured::Literal(_) => None,
        }
    }
}

/// Puts `[secret:<name>]` in place of every exact occurrence of a secret's
/// value, the longest values first (one that contains another is named as
/// itself). Its `Debug` names the secrets only.
#[derive(Clone, Default)]
pub struct Scrubber {
    values: Vec<(String, SecretValue)>,
}

impl Scrubber {
    pub fn new(values: impl IntoIterator<Item = (String, SecretValue)>) -> Scrubber {
        let mut values: Vec<_> = values
            .into_iter()
            .filter(|(_, v)| v.0.len() >= MIN_VALUE_BYTES)
            .collect();
        values.sort_by(|a, b| b.1 .0.len().cmp(&a.1 .0.len()).then(a.0.cmp(&b.0)));
        Scrubber { values }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `text` with every value replaced.
    pub fn scrub_str<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for (name, value) in &self.values {
            if out.contains(value.expose()) {
                out = Cow::Owned(out.replace(value.expose(), &format!("[secret:{name}]")));
            }
        }
        out
    }

    /// Every string in `v` (keys too) scrubbed, as decoded: a value JSON
    /// escapes is found as well.
    pub fn scrub(&self, v: &mut Value) {
        if self.values.is_empty() {
            return;
        }
        match v {
            Value::String(s) => {
                if let Cow::Owned(clean) = self.scrub_str(s) {
                    *s = clean;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|i| self.scrub(i)),
            Value::Object(map) => {
                let entries = std::mem::take(map);
                for (k, mut item) in entries {
                    self.scrub(&mut item);
                    map.insert(self.scrub_str(&k).into_owned(), item);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
}

impl fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.values.iter().map(|(n, _)| n))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sealed(v: &str) -> Sealed {
        Sealed {
            key: DERIVED_KEY.into(),
            wrapped_key: None,
            value: v.into(),
        }
    }

    #[test]
    fn a_value_is_checked_and_never_shown_by_debug() {
        let v = SecretValue::parse(&json!({"value": "s3cr3t-token"})).unwrap();
        assert_eq!(v.expose(), "s3cr3t-token");
        assert!(!format!("{v:?}").contains("s3cr3t"));
        for (body, field) in [
            (json!({"value": "abc"}), "value"),
            (json!({"value": "x".repeat(MAX_VALUE_BYTES + 1)}), "value"),
            (json!({"value": 5}), "value"),
            (json!({}), "value"),
            (json!({"value": "abcd", "name": "x"}), "name"),
        ] {
            let e = SecretValue::parse(&body).unwrap_err();
            assert_eq!(e.field, field, "{body}");
        }
        assert!(check_name("crm-token").is_ok());
        assert!(check_name("CRM token").is_err());
    }

    #[test]
    fn a_secret_changes_through_its_machine_and_not_once_deleted() {
        let mut s = Secret::new("acme", "crm", sealed("a"), 10);
        assert_eq!((s.version(), s.state()), (1, SecretState::Live));
        assert_eq!(s.apply(SecretEvent::Put(sealed("b")), 20), Ok(vec![]));
        assert_eq!((s.version(), s.sealed().value.as_str()), (2, "b"));
        assert_eq!((s.created_at_ms, s.updated_at_ms), (10, 20));
        assert_eq!(s.apply(SecretEvent::Delete, 30), Ok(vec![]));
        assert_eq!(s.state(), SecretState::Deleted);
        let before = s.clone();
        assert_eq!(
            s.apply(SecretEvent::Put(sealed("c")), 40),
            Err(SecretRefusal::Deleted)
        );
        assert_eq!(s, before);
    }

    #[test]
    fn a_configured_value_is_a_string_or_names_a_secret() {
        assert_eq!(
            Configured::parse("h", &json!("Bearer x")).unwrap(),
            Configured::Literal("Bearer x".into())
        );
        let c = Configured::parse("h", &json!({"secret": "crm-token"})).unwrap();
        assert_eq!(c.secret(), Some("crm-token"));
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            json!({"secret": "crm-token"})
        );
        assert_eq!(
            serde_json::from_value::<Configured>(json!({"secret": "crm-token"})).unwrap(),
            c
        );
        for bad in [
            json!(1),
            json!({"secret": "A B"}),
            json!({"secret": "a", "x": 1}),
            json!({}),
        ] {
            let e = Configured::parse("headers.Authorization", &bad).unwrap_err();
            assert!(e.field.starts_with("headers.Authorization"), "{bad}");
        }
    }

    #[test]
    fn a_scrubber_names_each_value_it_finds_longest_first() {
        let s = Scrubber::new([
            ("short".to_string(), SecretValue::new("abcd".into())),
            ("long".to_string(), SecretValue::new("abcdefgh".into())),
            ("quote".to_string(), SecretValue::new("p\"ss w".into())),
            ("tiny".to_string(), SecretValue::new("ab".into())),
        ]);
        assert_eq!(
            s.scrub_str("x abcdefgh y abcd z ab"),
            "x [secret:long] y [secret:short] z ab"
        );
        assert!(matches!(s.scrub_str("nothing here"), Cow::Borrowed(_)));
        let mut v = json!({"body": "token=abcdefgh", "abcd": ["p\"ss w", 1, null]});
        s.scrub(&mut v);
        assert_eq!(
            v,
            json!({"body": "token=[secret:long]", "[secret:short]": ["[secret:quote]", 1, null]})
        );
        let shown = format!("{s:?}");
        assert!(shown.contains("long") && !shown.contains("abcd"));
    }
}
