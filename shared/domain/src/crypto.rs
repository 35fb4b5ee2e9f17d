//! Hashes, MACs and comparisons: a leaf module (it imports nothing of the
//! domain), so seals, credentials, approvals and messages use it without
//! reaching into the HTTP vocabulary. The primitives are RustCrypto's
//! (`sha2`, `hmac`, `subtle`) and `ring`'s (AES-GCM), not written here.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{KeyInit, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// SHA-256, hex-encoded.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// HMAC-SHA256 (RFC 2104), hex-encoded.
pub fn hmac_sha256_hex(key: &[u8], message: &[u8]) -> String {
    hex::encode(hmac_sha256(key, message))
}

/// HMAC-SHA256 (RFC 2104).
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    // Any key length is a valid HMAC key: `new_from_slice` cannot fail.
    let Ok(mut mac) = hmac::Hmac::<Sha256>::new_from_slice(key) else {
        return [0; 32];
    };
    mac.update(message);
    mac.finalize().into_bytes().into()
}

/// The signature Standard Webhooks (standardwebhooks.com) puts on `body`
/// sent as message `id` at `timestamp` with `secret` (`whsec_` and the
/// key in base64): `v1,<base64 HMAC-SHA256 of "id.timestamp.body">`.
/// `None` when the secret is not one.
pub fn standard_signature(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Option<String> {
    let key = BASE64.decode(secret.strip_prefix("whsec_")?).ok()?;
    let mut signed = format!("{id}.{timestamp}.").into_bytes();
    signed.extend_from_slice(body);
    Some(format!("v1,{}", BASE64.encode(hmac_sha256(&key, &signed))))
}

/// Whether two digests (hex strings, or any secret strings) are equal,
/// compared in constant time: how far a guess matched is never timed.
/// Their lengths are public (every digest of a kind has the same).
pub fn digest_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// A 256-bit key for `purpose`, derived from a deployment's secret
/// (HMAC-SHA256 of the purpose under the secret: one key per purpose, and
/// none of them reveals the secret or another).
pub fn derive_key(deployment_secret: &str, purpose: &str) -> [u8; 32] {
    hmac_sha256(deployment_secret.as_bytes(), purpose.as_bytes())
}

/// AES-256-GCM (`ring`'s) of `plain` under `key` and a fresh random
/// nonce, authenticating `aad` too: the nonce, then the ciphertext and
/// its tag. `None` only if the system has no randomness to give.
pub fn aead_seal(key: &[u8; 32], aad: &[u8], plain: &[u8]) -> Option<Vec<u8>> {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
    use ring::rand::{SecureRandom, SystemRandom};
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).ok()?);
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new().fill(&mut nonce).ok()?;
    let mut sealed = plain.to_vec();
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(aad),
        &mut sealed,
    )
    .ok()?;
    let mut out = nonce.to_vec();
    out.append(&mut sealed);
    Some(out)
}

/// What [`aead_seal`] sealed, if `key` and `aad` are the ones it was
/// sealed with and nothing was changed.
pub fn aead_open(key: &[u8; 32], aad: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).ok()?);
    let (nonce, body) = sealed.split_at_checked(NONCE_LEN)?;
    let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
    let mut body = body.to_vec();
    let plain = key.open_in_place(nonce, Aad::from(aad), &mut body).ok()?;
    Some(plain.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Case 2, and case 6 (a key longer than the block).
        assert_eq!(
            hmac_sha256_hex(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hmac_sha256_hex(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            ),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn sealed_bytes_open_only_under_their_key_and_context() {
        let key = derive_key("a deployment secret", "armada-secrets v1");
        let sealed = aead_seal(&key, b"acme/crm", b"hunter2").unwrap();
        assert_eq!(aead_open(&key, b"acme/crm", &sealed).unwrap(), b"hunter2");
        // Each seal draws its own nonce: the same value never looks alike.
        assert_ne!(aead_seal(&key, b"acme/crm", b"hunter2").unwrap(), sealed);
        assert!(!sealed.windows(7).any(|w| w == b"hunter2"));
        // Another tenant's name, another key, a flipped bit: nothing.
        assert_eq!(aead_open(&key, b"other/crm", &sealed), None);
        let other = derive_key("a deployment secret", "another purpose");
        assert_eq!(aead_open(&other, b"acme/crm", &sealed), None);
        let mut flipped = sealed.clone();
        flipped[14] ^= 1;
        assert_eq!(aead_open(&key, b"acme/crm", &flipped), None);
        assert_eq!(aead_open(&key, b"acme/crm", &sealed[..5]), None);
    }

    #[test]
    fn digests_compare_equal_only_when_equal() {
        assert!(digest_eq("abc", "abc"));
        assert!(!digest_eq("abc", "abd"));
        assert!(!digest_eq("abc", "abcd"));
        assert_eq!(sha256_hex(b"").len(), 64);
    }
}
