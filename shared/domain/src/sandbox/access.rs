//! What one sandbox identity may touch in AWS: the session policy its
//! task's credentials are scoped by (AssumeRole with a `Policy`, which can
//! only narrow the role's own). A task of tenant A, agent a, generation g
//! may receive from its own hand queue only, post to the platform's queues
//! (what it posts is judged there: answers are sealed), read and write its
//! own sandbox record and write its report there (never the control
//! plane's half: `dynamodb:Attributes`), write its own call marks only
//! (`dynamodb:LeadingKeys`), and its own objects only
//! (`sandboxes/<tenant>/<agent>/`).

use serde_json::{json, Value};

use super::lifecycle::sandbox_key;

/// The attributes of its own record a task may name in a write: its
/// report (the half of the record the control plane reads as untrusted)
/// and the version its write is conditional on (so its report never
/// overwrites a change of the control plane's it did not see). The
/// control half (`doc`, and the identity attributes) is out of reach.
pub const REPORT_ATTRIBUTES: [&str; 3] = ["sandbox_key", "report", "version"];

/// The ARNs a policy names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformArns {
    /// `arn:<partition>:sqs:<region>:<account>:` — queue ARNs start so.
    pub sqs_prefix: String,
    pub harness_queue: String,
    pub dispatch_queue: String,
    pub sandboxes_table: String,
    /// `arn:<partition>:s3:::<bucket>`.
    pub payload_bucket: String,
}

/// Where an identity's objects live in the payload bucket.
pub fn object_prefix(tenant: &str, agent: &str) -> String {
    format!("sandboxes/{tenant}/{agent}/")
}

/// The key prefix of an identity's call marks in the sandboxes table.
pub fn mark_prefix(tenant: &str, agent: &str) -> String {
    format!("call#{}#", sandbox_key(tenant, agent))
}

/// The key of one call's mark: under its identity's prefix, so the
/// identity's credentials reach its own marks only.
pub fn mark_key(tenant: &str, agent: &str, run_id: &str, call_id: &str, attempt: u32) -> String {
    format!("{}{run_id}#{call_id}#{attempt}", mark_prefix(tenant, agent))
}

/// Where an outcome too large for a message is stored.
pub fn outcome_key(tenant: &str, agent: &str, run_id: &str, call_id: &str, attempt: u32) -> String {
    format!(
        "{}outcomes/{run_id}/{call_id}-{attempt}.json",
        object_prefix(tenant, agent)
    )
}

/// Where a hibernated generation's workspace is saved.
pub fn snapshot_key(tenant: &str, agent: &str, generation: u64) -> String {
    format!(
        "{}g{generation}/workspace.tar.gz",
        object_prefix(tenant, agent)
    )
}

impl PlatformArns {
    /// The ARNs of the platform's resources, from the identity role's ARN
    /// (its partition and account: the resources live beside it), the
    /// region, the queues' URLs (whose last segment is the name), the
    /// table's and the bucket's names.
    pub fn derive(
        role_arn: &str,
        region: &str,
        harness_queue_url: &str,
        dispatch_queue_url: &str,
        sandboxes_table: &str,
        payload_bucket: &str,
    ) -> Option<PlatformArns> {
        // arn:<partition>:iam::<account>:role/<name>
        let mut parts = role_arn.split(':');
        let (arn, partition, service, _, account) = (
            parts.next()?,
            parts.next()?,
            parts.next()?,
            parts.next()?,
            parts.next()?,
        );
        if arn != "arn" || service != "iam" || account.is_empty() || region.is_empty() {
            return None;
        }
        let name = |url: &str| {
            url.rsplit('/')
                .next()
                .filter(|n| !n.is_empty())
                .map(str::to_string)
        };
        let sqs_prefix = format!("arn:{partition}:sqs:{region}:{account}:");
        Some(PlatformArns {
            harness_queue: format!("{sqs_prefix}{}", name(harness_queue_url)?),
            dispatch_queue: format!("{sqs_prefix}{}", name(dispatch_queue_url)?),
            sqs_prefix,
            sandboxes_table: format!(
                "arn:{partition}:dynamodb:{region}:{account}:table/{sandboxes_table}"
            ),
            payload_bucket: format!("arn:{partition}:s3:::{payload_bucket}"),
        })
    }
}

/// The session policy of one generation's task.
pub fn session_policy(tenant: &str, agent: &str, hand_queue: &str, arns: &PlatformArns) -> Value {
    json!({
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "OwnHandQueue",
                "Effect": "Allow",
                "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes"],
                "Resource": format!("{}{hand_queue}", arns.sqs_prefix),
            },
            {
                "Sid": "PlatformQueues",
                "Effect": "Allow",
                "Action": ["sqs:SendMessage"],
                "Resource": [arns.harness_queue, arns.dispatch_queue],
            },
            {
                "Sid": "OwnMarks",
                "Effect": "Allow",
                "Action": ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"],
                "Resource": arns.sandboxes_table,
                "Condition": {
                    "ForAllValues:StringLike": {
                        "dynamodb:LeadingKeys": [format!("{}*", mark_prefix(tenant, agent))]
                    }
                }
            },
            {
                "Sid": "OwnRecordRead",
                "Effect": "Allow",
                "Action": ["dynamodb:GetItem"],
                "Resource": arns.sandboxes_table,
                "Condition": {
                    "ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [sandbox_key(tenant, agent)]}
                }
            },
            {
                "Sid": "OwnReport",
                "Effect": "Allow",
                "Action": ["dynamodb:UpdateItem"],
                "Resource": arns.sandboxes_table,
                "Condition": {
                    "ForAllValues:StringEquals": {
                        "dynamodb:LeadingKeys": [sandbox_key(tenant, agent)],
                        "dynamodb:Attributes": REPORT_ATTRIBUTES,
                    }
                }
            },
            {
                "Sid": "OwnObjects",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject"],
                "Resource": format!("{}/{}*", arns.payload_bucket, object_prefix(tenant, agent)),
            },
        ]
    })
}

#[cfg(test)]
#[path = "access_tests.rs"]
mod tests;
