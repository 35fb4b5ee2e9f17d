//! Whether a delivery to a hook comes from whoever holds its secret,
//! checked over the raw bytes before anything is parsed, and the secrets
//! themselves: derived from the deployment's secret, the hook and the salt
//! of its last rotation, so no secret is stored anywhere.
//!
//! - GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`
//!   (docs.github.com, "Validating webhook deliveries").
//! - Standard Webhooks: `webhook-signature: v1,<base64 HMAC-SHA256 of
//!   "id.timestamp.body">`, a space-separated list of which any one may
//!   match, with a timestamp within five minutes (standardwebhooks.com).
//! - Alertmanager: `Authorization: Bearer <secret>`.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

use crate::crypto::{digest_eq, hmac_sha256, standard_signature};
use crate::hook::HookKind;

/// How far a Standard Webhooks timestamp may be from now, either way.
pub const TIMESTAMP_TOLERANCE_S: i64 = 5 * 60;

/// The Standard Webhooks secret prefix.
const WHSEC: &str = "whsec_";

/// The secret of hook `hook_id` after the rotation that stored `salt`, in
/// the form its sender is configured with: for `github` 32 bytes in hex
/// (what GitHub's "Secret" field takes), for `standard` `whsec_` and their
/// base64 (the Standard Webhooks format), for `alertmanager` a bearer
/// token (their hex).
pub fn hook_secret(deployment_secret: &str, hook_id: &str, salt: &str, kind: HookKind) -> String {
    let raw = hmac_sha256(
        deployment_secret.as_bytes(),
        format!("armada-hook-secret\n{hook_id}\n{salt}").as_bytes(),
    );
    match kind {
        HookKind::Github | HookKind::Alertmanager | HookKind::Cloudwatch => hex::encode(raw),
        HookKind::Standard => format!("{WHSEC}{}", BASE64.encode(raw)),
    }
}

/// What a delivery says about who sent it, as its headers carry it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials<'a> {
    /// `X-Hub-Signature-256`.
    pub hub_signature: Option<&'a str>,
    /// `webhook-id`, `webhook-timestamp`, `webhook-signature`.
    pub webhook_id: Option<&'a str>,
    pub webhook_timestamp: Option<&'a str>,
    pub webhook_signature: Option<&'a str>,
    /// `Authorization`.
    pub authorization: Option<&'a str>,
}

/// A delivery that does not prove its sender. One reason for every case,
/// so a caller learns nothing from which check failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the delivery's signature, token or timestamp is missing or wrong")]
pub struct Unverified;

/// Checks `body`, exactly as received, against `secret` (the hook's, as
/// [`hook_secret`] derives it) the way `kind` signs.
pub fn verify(
    kind: HookKind,
    secret: &str,
    body: &[u8],
    sent: &Credentials<'_>,
    now_s: i64,
) -> Result<(), Unverified> {
    let ok = match kind {
        HookKind::Github => sent
            .hub_signature
            .and_then(|h| h.strip_prefix("sha256="))
            .is_some_and(|hex_sig| {
                digest_eq(
                    &hex_sig.to_ascii_lowercase(),
                    &hex::encode(hmac_sha256(secret.as_bytes(), body)),
                )
            }),
        HookKind::Standard => standard_ok(secret, body, sent, now_s),
        // Its alarms come through its topic, never to its URL.
        HookKind::Cloudwatch => false,
        HookKind::Alertmanager => sent
            .authorization
            .and_then(|a| a.strip_prefix("Bearer "))
            .is_some_and(|token| digest_eq(token.trim(), secret)),
    };
    ok.then_some(()).ok_or(Unverified)
}

fn standard_ok(secret: &str, body: &[u8], sent: &Credentials<'_>, now_s: i64) -> bool {
    let (Some(id), Some(ts), Some(sigs)) = (
        sent.webhook_id,
        sent.webhook_timestamp,
        sent.webhook_signature,
    ) else {
        return false;
    };
    let Ok(timestamp) = ts.trim().parse::<i64>() else {
        return false;
    };
    if (now_s - timestamp).abs() > TIMESTAMP_TOLERANCE_S {
        return false;
    }
    let Some(expected) = standard_signature(secret, id, timestamp, body) else {
        return false;
    };
    // Every listed signature is compared (no early exit on a match).
    sigs.split_whitespace()
        .filter(|s| s.starts_with("v1,"))
        .fold(false, |found, s| digest_eq(s, &expected) | found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn githubs_published_test_vector_verifies() {
        // docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
        let sent = Credentials {
            hub_signature: Some(
                "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
            ),
            ..Credentials::default()
        };
        let secret = "It's a Secret to Everybody";
        assert_eq!(
            verify(HookKind::Github, secret, b"Hello, World!", &sent, 0),
            Ok(())
        );
        assert_eq!(
            verify(HookKind::Github, secret, b"Hello, World?", &sent, 0),
            Err(Unverified)
        );
        assert_eq!(
            verify(HookKind::Github, "another", b"Hello, World!", &sent, 0),
            Err(Unverified)
        );
        let unsigned = Credentials::default();
        assert_eq!(
            verify(HookKind::Github, secret, b"Hello, World!", &unsigned, 0),
            Err(Unverified)
        );
    }

    #[test]
    fn a_standard_signature_matches_the_specifications_example() {
        // The example of the Standard Webhooks specification (spec/standard-webhooks.md).
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
        let body = br#"{"test": 2432232314}"#;
        let sig = standard_signature(secret, id, 1614265330, body).unwrap();
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        let sent = |sigs: &'static str, ts: &'static str| Credentials {
            webhook_id: Some(id),
            webhook_timestamp: Some(ts),
            webhook_signature: Some(sigs),
            ..Credentials::default()
        };
        let now = 1614265330 + 10;
        let ok = "v1,bm9wZQ== v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
        assert_eq!(
            verify(
                HookKind::Standard,
                secret,
                body,
                &sent(ok, "1614265330"),
                now
            ),
            Ok(())
        );
        // Too old, too new, unsigned by this secret, or not a number.
        let late = 1614265330 + TIMESTAMP_TOLERANCE_S + 1;
        for (sigs, ts, now) in [
            (ok, "1614265330", late),
            (ok, "1614265330", 1614265330 - TIMESTAMP_TOLERANCE_S - 1),
            ("v1,bm9wZQ==", "1614265330", now),
            (ok, "soon", now),
        ] {
            assert_eq!(
                verify(HookKind::Standard, secret, body, &sent(sigs, ts), now),
                Err(Unverified),
                "{sigs} {ts} {now}"
            );
        }
    }

    #[test]
    fn secrets_take_their_kinds_form_and_change_with_each_rotation() {
        let github = hook_secret("deploy", "hook_1", "", HookKind::Github);
        assert_eq!(github.len(), 64);
        assert!(github.bytes().all(|b| b.is_ascii_hexdigit()));
        let standard = hook_secret("deploy", "hook_1", "", HookKind::Standard);
        let key = BASE64
            .decode(standard.strip_prefix("whsec_").unwrap())
            .unwrap();
        assert_eq!(hex::encode(key), github, "the same 32 bytes");
        assert_ne!(
            hook_secret("deploy", "hook_1", "s2", HookKind::Github),
            github
        );
        assert_ne!(
            hook_secret("deploy", "hook_2", "", HookKind::Github),
            github
        );
        assert_ne!(hook_secret("other", "hook_1", "", HookKind::Github), github);
        let bearer = |a: &'static str| Credentials {
            authorization: Some(a),
            ..Credentials::default()
        };
        let token = hook_secret("deploy", "hook_1", "", HookKind::Alertmanager);
        let header: &'static str = Box::leak(format!("Bearer {token}").into_boxed_str());
        assert_eq!(
            verify(HookKind::Alertmanager, &token, b"{}", &bearer(header), 0),
            Ok(())
        );
        assert_eq!(
            verify(
                HookKind::Alertmanager,
                &token,
                b"{}",
                &bearer("Bearer x"),
                0
            ),
            Err(Unverified)
        );
    }
}
