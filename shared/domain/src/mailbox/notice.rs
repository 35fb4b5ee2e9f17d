//! What SES says of a message it received for the deployment's domain
//! (a receipt rule's S3 action, with its topic): where the message is
//! stored, whom it is for, who sent it, and how its checks went. The
//! local stack's SMTP listener says the same of what it accepted.
//!
//! Every field SES may leave out is optional: a notice that cannot be
//! read names why, and its message is not read at all.

use serde::{Deserialize, Serialize};

/// A verdict's status: `PASS`, `FAIL`, `GRAY`, `PROCESSING_FAILED`, or
/// `DISABLED` (not checked: a rule without scanning, or the local
/// listener, which checks nothing).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Verdict {
    #[serde(default)]
    pub status: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Action {
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub bucket_name: Option<String>,
    #[serde(default)]
    pub object_key: Option<String>,
    #[serde(default)]
    pub topic_arn: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Receipt {
    #[serde(default)]
    pub recipients: Vec<String>,
    #[serde(default)]
    pub spam_verdict: Option<Verdict>,
    #[serde(default)]
    pub virus_verdict: Option<Verdict>,
    #[serde(default)]
    pub spf_verdict: Option<Verdict>,
    #[serde(default)]
    pub dkim_verdict: Option<Verdict>,
    #[serde(default)]
    pub dmarc_verdict: Option<Verdict>,
    #[serde(default)]
    pub action: Action,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MailMeta {
    /// The envelope sender (`MAIL FROM`).
    #[serde(default)]
    pub source: Option<String>,
    /// SES's id of the message (not its `Message-ID`).
    #[serde(default)]
    pub message_id: String,
}

/// SES's notice of a received message.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReceivedNotice {
    pub notification_type: String,
    #[serde(default)]
    pub receipt: Receipt,
    #[serde(default)]
    pub mail: MailMeta,
}

/// Where a received message is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub bucket: String,
    pub key: String,
}

impl ReceivedNotice {
    /// The notice of a message the local listener accepted and stored in
    /// `bucket` at `key`: as SES's, its checks `DISABLED` (nothing was
    /// checked: the listener is on loopback, for a developer's own mail).
    pub fn unchecked(
        id: &str,
        envelope_from: &str,
        recipients: &[String],
        bucket: &str,
        key: &str,
        topic_arn: &str,
    ) -> ReceivedNotice {
        let unchecked = || {
            Some(Verdict {
                status: "DISABLED".into(),
            })
        };
        ReceivedNotice {
            notification_type: "Received".into(),
            receipt: Receipt {
                recipients: recipients.to_vec(),
                spam_verdict: unchecked(),
                virus_verdict: unchecked(),
                spf_verdict: unchecked(),
                dkim_verdict: unchecked(),
                dmarc_verdict: unchecked(),
                action: Action {
                    kind: "S3".into(),
                    bucket_name: Some(bucket.into()),
                    object_key: Some(key.into()),
                    topic_arn: Some(topic_arn.into()),
                },
            },
            mail: MailMeta {
                source: Some(envelope_from.into()),
                message_id: id.into(),
            },
        }
    }

    /// Reads a notice from what the mail queue holds: SES's JSON, or an
    /// SNS notification (not raw delivery) whose `Message` it is.
    pub fn parse(body: &str) -> Result<ReceivedNotice, String> {
        let v: serde_json::Value =
            serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))?;
        let v = match (v.get("Type"), v.get("Message").and_then(|m| m.as_str())) {
            (Some(t), Some(m)) if t == "Notification" => {
                serde_json::from_str(m).map_err(|e| format!("its SNS message is not JSON: {e}"))?
            }
            _ => v,
        };
        serde_json::from_value(v).map_err(|e| format!("not an SES notice: {e}"))
    }

    /// Where the message is: only an S3 action's notice has it.
    pub fn stored(&self) -> Result<Stored, String> {
        if self.notification_type != "Received" {
            return Err(format!(
                "a '{}' notice carries no message",
                self.notification_type
            ));
        }
        let a = &self.receipt.action;
        match (a.kind.as_str(), &a.bucket_name, &a.object_key) {
            ("S3", Some(bucket), Some(key)) if !bucket.is_empty() && !key.is_empty() => {
                Ok(Stored {
                    bucket: bucket.clone(),
                    key: key.clone(),
                })
            }
            _ => Err(format!(
                "a '{}' action's notice does not say where the message is stored",
                a.kind
            )),
        }
    }

    /// Why SES's checks did not pass (`None`: they did, or were not run).
    /// Every verdict must be `PASS`; one a rule did not check
    /// (`DISABLED`) or SES did not report does not count against it.
    pub fn failed_checks(&self) -> Option<String> {
        let r = &self.receipt;
        let failed: Vec<String> = [
            ("spam", &r.spam_verdict),
            ("virus", &r.virus_verdict),
            ("SPF", &r.spf_verdict),
            ("DKIM", &r.dkim_verdict),
            ("DMARC", &r.dmarc_verdict),
        ]
        .into_iter()
        .filter_map(|(name, v)| {
            let status = v.as_ref()?.status.as_str();
            (!matches!(status, "PASS" | "DISABLED" | "")).then(|| format!("{name} {status}"))
        })
        .collect();
        (!failed.is_empty()).then(|| format!("SES's checks did not pass: {}", failed.join(", ")))
    }
}
