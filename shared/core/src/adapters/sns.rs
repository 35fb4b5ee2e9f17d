//! Cloudwatch hooks' alarm topics on SNS: `<prefix><hook_id>`, each open
//! to CloudWatch (its alarms' actions publish there) and subscribed to the
//! stack's alarms queue, which the dispatcher consumes. A topic's name
//! says which hook it is for.

use async_trait::async_trait;
use aws_sdk_sns::Client;

use crate::config::Config;
use crate::error::{classify, StoreError};
use crate::ports::Topics;

#[derive(Debug, Clone)]
pub struct AlarmTopics {
    client: Client,
    /// `<stack>-alarms-`.
    prefix: String,
    queue_arn: String,
}

impl AlarmTopics {
    pub fn new(client: Client, cfg: &Config) -> Self {
        AlarmTopics {
            client,
            prefix: cfg.alarms.topic_prefix.clone(),
            queue_arn: cfg.alarms.queue_arn.clone(),
        }
    }
}

/// The topic's policy: its owner may manage it, CloudWatch of the same
/// account may publish to it.
fn policy(topic_arn: &str) -> String {
    let account = topic_arn.split(':').nth(4).unwrap_or_default();
    serde_json::json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Sid": "CloudWatchAlarms",
            "Effect": "Allow",
            "Principal": {"Service": "cloudwatch.amazonaws.com"},
            "Action": "sns:Publish",
            "Resource": topic_arn,
            "Condition": {"StringEquals": {"aws:SourceAccount": account}},
        }],
    })
    .to_string()
}

#[async_trait]
impl Topics for AlarmTopics {
    async fn create(&self, hook_id: &str) -> Result<String, StoreError> {
        let made = self
            .client
            .create_topic()
            .name(format!("{}{hook_id}", self.prefix))
            .send()
            .await
            .map_err(classify)?;
        let arn = made
            .topic_arn()
            .ok_or_else(|| StoreError::Terminal("a topic without an ARN".into()))?
            .to_string();
        self.client
            .set_topic_attributes()
            .topic_arn(&arn)
            .attribute_name("Policy")
            .attribute_value(policy(&arn))
            .send()
            .await
            .map_err(classify)?;
        self.client
            .subscribe()
            .topic_arn(&arn)
            .protocol("sqs")
            .endpoint(&self.queue_arn)
            .send()
            .await
            .map_err(classify)?;
        Ok(arn)
    }

    async fn delete(&self, topic_arn: &str) -> Result<(), StoreError> {
        match self.client.delete_topic().topic_arn(topic_arn).send().await {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|se| se.is_not_found_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(classify(e)),
        }
    }

    fn hook_of(&self, topic_arn: &str) -> Option<String> {
        let name = topic_arn.rsplit(':').next()?;
        name.strip_prefix(&self.prefix).map(str::to_string)
    }
}
