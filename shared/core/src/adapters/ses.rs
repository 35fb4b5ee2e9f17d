//! Email through SES (v2), as one raw RFC 5322 message per recipient; on
//! the local stack each accepted message is also written as an `.eml` file
//! to the outbox directory, for a person to open and a test to follow.

use std::path::PathBuf;

use async_trait::async_trait;
use aws_sdk_sesv2::primitives::Blob;
use aws_sdk_sesv2::types::{Destination, EmailContent, RawMessage};

use crate::ports::Mail;

#[derive(Debug, Clone)]
pub struct SesMail {
    ses: aws_sdk_sesv2::Client,
    from: String,
    outbox: Option<PathBuf>,
}

impl SesMail {
    pub fn new(ses: aws_sdk_sesv2::Client, from: &str, outbox: Option<PathBuf>) -> Self {
        SesMail {
            ses,
            from: from.to_string(),
            outbox,
        }
    }
}

/// A header value as RFC 2047 wants it: ASCII as is, anything else
/// base64-encoded UTF-8; control characters (header injection) dropped.
fn header_value(v: &str) -> String {
    let clean: String = v.chars().filter(|c| !c.is_control()).collect();
    if clean.is_ascii() {
        clean
    } else {
        format!(
            "=?UTF-8?B?{}?=",
            aws_smithy_types::base64::encode(clean.as_bytes())
        )
    }
}

/// One plain-text message, whole: headers and body.
pub fn compose(from: &str, to: &str, subject: &str, text: &str, now_ms: i64, id: &str) -> String {
    let date = time::OffsetDateTime::from_unix_timestamp(now_ms / 1000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
        .format(&time::format_description::well_known::Rfc2822)
        .unwrap_or_default();
    let domain = from.rsplit('@').next().unwrap_or("armada.local");
    let seven_bit = text.is_ascii() && text.lines().all(|l| l.len() <= 900);
    let (encoding, body) = if seven_bit {
        ("7bit", text.replace('\n', "\r\n"))
    } else {
        let b64 = aws_smithy_types::base64::encode(text.as_bytes());
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(76)
            .map(|c| std::str::from_utf8(c).unwrap_or_default())
            .collect();
        ("base64", lines.join("\r\n"))
    };
    format!(
        "From: {from}\r\nTo: {to}\r\nSubject: {subject}\r\nDate: {date}\r\nMessage-ID: <{id}@{domain}>\r\n\
         MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: {encoding}\r\n\r\n{body}\r\n",
        from = header_value(from),
        to = header_value(to),
        subject = header_value(subject),
    )
}

impl SesMail {
    /// Sends `raw` through SES, then writes it to the outbox (when there
    /// is one).
    async fn deliver(&self, from: &str, to: &str, raw: &str) -> Result<String, String> {
        let out = self
            .ses
            .send_email()
            .from_email_address(from)
            .destination(Destination::builder().to_addresses(to).build())
            .content(
                EmailContent::builder()
                    .raw(
                        RawMessage::builder()
                            .data(Blob::new(raw.as_bytes()))
                            .build()
                            .map_err(|e| e.to_string())?,
                    )
                    .build(),
            )
            .send()
            .await
            .map_err(|e| aws_smithy_types::error::display::DisplayErrorContext(&e).to_string())?;
        let local_id = crate::clock::new_id("msg");
        if let Some(dir) = &self.outbox {
            let now_ms = crate::clock::Clock::default().now_ms();
            let file = dir.join(format!("{now_ms}-{local_id}.eml"));
            if let Err(e) = write_private(dir, &file, raw.as_bytes()).await {
                tracing::warn!(file = %file.display(), error = %e, "email sent but not written to the outbox");
            }
        }
        Ok(out.message_id().unwrap_or(&local_id).to_string())
    }
}

#[async_trait]
impl Mail for SesMail {
    async fn send(&self, to: &str, subject: &str, text: &str) -> Result<String, String> {
        let now_ms = crate::clock::Clock::default().now_ms();
        let raw = compose(
            &self.from,
            to,
            subject,
            text,
            now_ms,
            &crate::clock::new_id("msg"),
        );
        self.deliver(&self.from, to, &raw).await
    }

    async fn send_raw(&self, from: &str, to: &str, message: &str) -> Result<String, String> {
        self.deliver(from, to, message).await
    }
}

/// Writes an outbox file its owner alone may read (0600, in a 0700
/// directory): it holds live approval links.
async fn write_private(
    dir: &std::path::Path,
    file: &std::path::Path,
    bytes: &[u8],
) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    use tokio::io::AsyncWriteExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    // A directory made before (by an older stack) is closed too.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    let mut f = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
        .await?;
    f.write_all(bytes).await?;
    f.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn outbox_files_are_the_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("armada-outbox-{}", std::process::id()));
        let dir = base.join("outbox");
        let file = dir.join("1-a.eml");
        write_private(&dir, &file, b"To: x").await.unwrap();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&dir), mode(&file)), (0o700, 0o600));
        assert_eq!(std::fs::read(&file).unwrap(), b"To: x");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn messages_are_whole_and_headers_cannot_be_injected() {
        let raw = compose(
            "a@example.com",
            "b@example.com",
            "Hi\r\nBcc: evil@x.y",
            "line 1\nhttp://x/y?token=t\n",
            0,
            "m1",
        );
        assert!(raw.contains("Subject: HiBcc: evil@x.y\r\n"), "{raw}");
        assert!(!raw.contains("\r\nBcc:"));
        assert!(raw.contains("Content-Transfer-Encoding: 7bit"));
        assert!(raw.contains("http://x/y?token=t\r\n"));
        let utf = compose(
            "a@example.com",
            "b@example.com",
            "Genehmigung nötig",
            "grüße",
            0,
            "m2",
        );
        assert!(utf.contains("Subject: =?UTF-8?B?"));
        assert!(utf.contains("Content-Transfer-Encoding: base64"));
    }
}
