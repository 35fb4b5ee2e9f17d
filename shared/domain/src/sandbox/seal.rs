//! Answers a sandbox can give only for itself.
//!
//! Every sandbox task shares one task role, so a jail escape in tenant A's
//! task could post a `ToolResult` naming tenant B's Run. Each generation's
//! agent therefore gets a key of its own, derived from the deployment's
//! secret (which no task holds) and its identity — tenant, agent,
//! generation — and seals every answer with it. The harness derives the key
//! of the generation its ledger says the call was sent to, from the Run's
//! own tenant and agent, and refuses an answer whose seal does not hold:
//! A's key can only ever seal answers for A's calls.

use serde::{Deserialize, Serialize};

use crate::crypto::{digest_eq, hmac_sha256_hex};
use crate::sandbox::hand::ResultBody;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seal {
    pub generation: u64,
    /// HMAC-SHA256 (hex) of the answer with the generation's key.
    pub mac: String,
}

/// The key of one sandbox generation (hex). Never stored: the provider
/// hands it to the task it starts; the harness derives it again. `salt` is
/// the sandbox record's own ([`crate::sandbox::lifecycle::SandboxRecord`]'s
/// `salt`): an identity whose record was deleted (its agent was) starts
/// again at generation 1, and its new generation 1 gets another key.
pub fn answer_key(
    deployment_secret: &str,
    tenant: &str,
    agent: &str,
    generation: u64,
    salt: &str,
) -> String {
    // A record from before salts (empty) keeps the key it had.
    let salted = if salt.is_empty() {
        String::new()
    } else {
        format!("\n{salt}")
    };
    hmac_sha256_hex(
        deployment_secret.as_bytes(),
        format!("armada-sandbox-answer\n{tenant}\n{agent}\n{generation}{salted}").as_bytes(),
    )
}

/// What a seal covers: every field of the answer. The body is serialized
/// through `serde_json::Value`, whose maps are sorted, so sender and
/// receiver write the same bytes.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    pub run_id: &'a str,
    pub tenant: &'a str,
    pub step: u32,
    pub call_id: &'a str,
    pub attempt: u32,
    pub body: &'a ResultBody,
}

impl Answer<'_> {
    fn text(&self, generation: u64) -> String {
        let body = serde_json::to_value(self.body)
            .map(|v| v.to_string())
            .unwrap_or_default();
        format!(
            "{}\n{}\n{}\n{}\n{}\n{generation}\n{body}",
            self.run_id, self.tenant, self.step, self.call_id, self.attempt
        )
    }

    pub fn seal(&self, key: &str, generation: u64) -> Seal {
        Seal {
            generation,
            mac: hmac_sha256_hex(key.as_bytes(), self.text(generation).as_bytes()),
        }
    }

    /// Whether `seal` was made with `key` for this very answer.
    pub fn sealed_by(&self, seal: &Seal, key: &str) -> bool {
        let want = hmac_sha256_hex(key.as_bytes(), self.text(seal.generation).as_bytes());
        digest_eq(&want, &seal.mac)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::hand::CallOutcome;

    fn body(text: &str) -> ResultBody {
        ResultBody::Inline {
            outcome: CallOutcome::Finished {
                result: serde_json::json!({"stdout": text, "b": 1, "a": [2.5, null]}),
            },
        }
    }

    #[test]
    fn a_seal_holds_only_for_its_identity_its_generation_and_its_answer() {
        let b = body("ok");
        let answer = Answer {
            run_id: "run_b",
            tenant: "b",
            step: 3,
            call_id: "c1",
            attempt: 1,
            body: &b,
        };
        let key_b = answer_key("deployment", "b", "coder", 7, "");
        let seal = answer.seal(&key_b, 7);
        assert!(answer.sealed_by(&seal, &key_b));
        // A's task knows only A's key.
        let key_a = answer_key("deployment", "a", "coder", 7, "");
        assert!(!answer.sealed_by(&answer.seal(&key_a, 7), &key_b));
        // Another generation of B's sandbox has another key.
        assert!(!answer.sealed_by(&seal, &answer_key("deployment", "b", "coder", 8, "")));
        let relabelled = Seal {
            generation: 8,
            ..seal.clone()
        };
        assert!(!answer.sealed_by(&relabelled, &key_b));
        // Any change to the answer breaks the seal.
        let other = body("forged");
        let forged = Answer {
            body: &other,
            ..answer
        };
        assert!(!forged.sealed_by(&seal, &key_b));
        assert!(!Answer {
            attempt: 2,
            ..answer
        }
        .sealed_by(&seal, &key_b));
        assert!(!Answer {
            call_id: "c2",
            ..answer
        }
        .sealed_by(&seal, &key_b));
    }

    #[test]
    fn the_body_is_written_canonically() {
        // A map's keys in sorted order whatever order they came in: the
        // receiver re-serializes what it parsed.
        let parsed: ResultBody = serde_json::from_str(
            r#"{"where":"inline","outcome":{"kind":"finished","result":{"z":1,"a":{"y":2,"b":3}}}}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let text = serde_json::to_value(&parsed)
            .unwrap_or_default()
            .to_string();
        assert!(text.contains(r#"{"a":{"b":3,"y":2},"z":1}"#), "{text}");
    }

    #[test]
    fn a_salt_makes_a_generation_key_of_its_own() {
        let before = answer_key("deployment", "a", "coder", 1, "");
        let first = answer_key("deployment", "a", "coder", 1, "0a1b2c3d4e5f6a7b");
        let again = answer_key("deployment", "a", "coder", 1, "99aa88bb77cc66dd");
        assert_ne!(
            first, again,
            "a recreated record's generation 1 has another key"
        );
        assert_ne!(first, before);
        assert_eq!(
            first,
            answer_key("deployment", "a", "coder", 1, "0a1b2c3d4e5f6a7b")
        );
    }
}
