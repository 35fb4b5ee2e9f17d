//! The local stack's inbound mail: an SMTP listener (RFC 5321, the part a
//! mail client or `swaks` speaks: EHLO/HELO, MAIL, RCPT, DATA, RSET,
//! NOOP, QUIT) that plays SES's receipt rule. It takes mail only for
//! existing mailboxes (`550` otherwise), stores each message in the
//! payload bucket under `mail/inbound/`, and announces it on the mail
//! topic with the notice SES would publish, so the functions read local
//! mail exactly as they read SES's. It checks no SPF, DKIM or DMARC (its
//! notices say `DISABLED`): it listens on loopback only.

use std::sync::Arc;

use anyhow::Result;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use armada_core::clock::new_id;
use armada_core::Services;
use armada_domain::mailbox::notice::ReceivedNotice;

/// The largest message taken: SES's.
const MAX_MESSAGE: usize = 40 * 1024 * 1024;
/// The longest command line (RFC 5321 says 512; some clients send more).
const MAX_LINE: usize = 4096;
/// The most recipients of one message.
const MAX_RECIPIENTS: usize = 100;

/// What a listener needs: the functions' ports and where SES would
/// announce mail.
#[derive(Clone)]
pub struct Listener {
    pub svc: Arc<Services>,
    pub aws: armada_core::adapters::aws::AwsClients,
}

pub async fn serve(listener: TcpListener, inbox: Listener, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let inbox = inbox.clone();
                tokio::spawn(async move {
                    if let Err(e) = inbox.session(stream).await {
                        tracing::debug!(error = %e, "an SMTP session ended");
                    }
                });
            }
        }
    }
}

/// A command's verb and its argument.
fn command(line: &str) -> (String, &str) {
    let line = line.trim_end_matches(['\r', '\n']);
    match line.split_once(' ') {
        Some((verb, rest)) => (verb.to_ascii_uppercase(), rest.trim()),
        None => (line.to_ascii_uppercase(), ""),
    }
}

/// The address in `FROM:<a@b> SIZE=…` or `TO:<a@b>` (empty for `<>`).
fn path(arg: &str, prefix: &str) -> Option<String> {
    let rest = arg.get(..prefix.len())?;
    if !rest.eq_ignore_ascii_case(prefix) {
        return None;
    }
    let rest = arg[prefix.len()..].trim_start();
    let inner = rest.strip_prefix('<')?.split_once('>')?.0;
    Some(inner.trim().to_ascii_lowercase())
}

impl Listener {
    async fn session(&self, stream: TcpStream) -> Result<()> {
        let domain = self.svc.cfg.inbox.domain.clone();
        let (read, mut write) = stream.into_split();
        let mut read = BufReader::new(read);
        write
            .write_all(format!("220 {domain} ESMTP Armada (local)\r\n").as_bytes())
            .await?;
        let mut from: Option<String> = None;
        let mut rcpts: Vec<String> = Vec::new();
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = (&mut read)
                .take(MAX_LINE as u64)
                .read_until(b'\n', &mut line)
                .await?;
            if n == 0 {
                return Ok(());
            }
            if !line.ends_with(b"\n") {
                write.write_all(b"500 5.5.2 Line too long\r\n").await?;
                return Ok(());
            }
            let text = String::from_utf8_lossy(&line).to_string();
            let (verb, arg) = command(&text);
            let answer = match verb.as_str() {
                "EHLO" => format!(
                    "250-{domain}\r\n250-SIZE {MAX_MESSAGE}\r\n250-8BITMIME\r\n250 ENHANCEDSTATUSCODES"
                ),
                "HELO" => format!("250 {domain}"),
                "NOOP" => "250 2.0.0 Ok".into(),
                "RSET" => {
                    from = None;
                    rcpts.clear();
                    "250 2.0.0 Ok".into()
                }
                "VRFY" => "252 2.5.2 Cannot verify; try RCPT".into(),
                "QUIT" => {
                    write.write_all(b"221 2.0.0 Bye\r\n").await?;
                    return Ok(());
                }
                "MAIL" => match path(arg, "FROM:") {
                    Some(_) if from.is_some() => "503 5.5.1 Sender already given".into(),
                    Some(a) => {
                        from = Some(a);
                        rcpts.clear();
                        "250 2.1.0 Ok".into()
                    }
                    None => "501 5.5.4 Syntax: MAIL FROM:<address>".into(),
                },
                "RCPT" => match (path(arg, "TO:"), &from) {
                    (_, None) => "503 5.5.1 MAIL first".into(),
                    (None, _) => "501 5.5.4 Syntax: RCPT TO:<address>".into(),
                    (Some(_), _) if rcpts.len() >= MAX_RECIPIENTS => {
                        "452 4.5.3 Too many recipients".into()
                    }
                    (Some(to), _) => match self.svc.mailboxes.at_address(&to).await {
                        Ok(Some(_)) => {
                            rcpts.push(to);
                            "250 2.1.5 Ok".into()
                        }
                        Ok(None) => format!("550 5.1.1 <{to}>: no such mailbox"),
                        Err(e) => {
                            tracing::warn!(error = %e, "a mailbox lookup failed");
                            "451 4.3.0 Try again later".into()
                        }
                    },
                },
                "DATA" if from.is_none() || rcpts.is_empty() => {
                    "503 5.5.1 No valid recipients".into()
                }
                "DATA" => {
                    write
                        .write_all(b"354 End data with <CR><LF>.<CR><LF>\r\n")
                        .await?;
                    let answer = match read_data(&mut read).await? {
                        Some(message) => {
                            let sender = from.take().unwrap_or_default();
                            let to = std::mem::take(&mut rcpts);
                            match self.accept(&sender, &to, &message).await {
                                Ok(id) => format!("250 2.0.0 Ok: queued as {id}"),
                                Err(e) => {
                                    tracing::warn!(error = %e, "a message was not stored");
                                    "451 4.3.0 Try again later".into()
                                }
                            }
                        }
                        None => {
                            from = None;
                            rcpts.clear();
                            "552 5.3.4 Message too big".into()
                        }
                    };
                    answer
                }
                "STARTTLS" => "502 5.5.1 Not offered (loopback only)".into(),
                "" => "500 5.5.2 Empty command".into(),
                _ => "502 5.5.2 Command not recognised".into(),
            };
            write.write_all(format!("{answer}\r\n").as_bytes()).await?;
        }
    }

    /// Stores a message and announces it as SES would; its id.
    async fn accept(&self, sender: &str, rcpts: &[String], message: &[u8]) -> Result<String> {
        let id = new_id("smtp");
        let key = format!("mail/inbound/{id}");
        self.svc
            .payloads
            .put_bytes(&key, message, "message/rfc822")
            .await?;
        let inbox = &self.svc.cfg.inbox;
        let notice = ReceivedNotice::unchecked(
            &id,
            sender,
            rcpts,
            &self.svc.cfg.payload_bucket,
            &key,
            &inbox.topic_arn,
        );
        self.aws
            .sns
            .publish()
            .topic_arn(&inbox.topic_arn)
            .message(serde_json::to_string(&notice)?)
            .send()
            .await?;
        tracing::info!(id, sender, recipients = rcpts.len(), "mail accepted");
        Ok(id)
    }
}

/// Reads a message up to its `.` line, undoing dot-stuffing; `None` when
/// it is over the limit (read to its end all the same, so the session
/// goes on).
async fn read_data<R: tokio::io::AsyncBufRead + Unpin>(read: &mut R) -> Result<Option<Vec<u8>>> {
    let mut message = Vec::new();
    let mut too_big = false;
    let mut line = Vec::new();
    loop {
        line.clear();
        if read.read_until(b'\n', &mut line).await? == 0 {
            anyhow::bail!("the connection closed in DATA");
        }
        if line == b".\r\n" || line == b".\n" {
            return Ok((!too_big).then_some(message));
        }
        let body = line.strip_prefix(b".").unwrap_or(&line);
        if message.len() + body.len() > MAX_MESSAGE {
            too_big = true;
            message.clear();
        }
        if !too_big {
            message.extend_from_slice(body);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_read_from_mail_and_rcpt() {
        assert_eq!(
            path("FROM:<Alice@Example.com> SIZE=120", "FROM:").as_deref(),
            Some("alice@example.com")
        );
        assert_eq!(path("from: <>", "FROM:").as_deref(), Some(""));
        assert_eq!(path("TO:bob@example.com", "TO:"), None);
        assert_eq!(command("rcpt TO:<a@b>\r\n"), ("RCPT".into(), "TO:<a@b>"));
    }

    #[tokio::test]
    async fn data_is_read_to_its_dot_and_unstuffed() {
        let wire = b"Subject: x\r\n\r\n..a line starting with a dot\r\n.\r\nQUIT\r\n".to_vec();
        let mut r = tokio::io::BufReader::new(wire.as_slice());
        let m = read_data(&mut r).await.unwrap().unwrap();
        assert_eq!(m, b"Subject: x\r\n\r\n.a line starting with a dot\r\n");
    }
}
