//! AWS clients, built once per process from the default credential chain.
//! `AWS_ENDPOINT_URL` (or an explicit endpoint) points every client at an
//! emulator; an interceptor counts API calls per service and operation for
//! `armada bench`.

use aws_config::BehaviorVersion;

pub use crate::calls::{CallCounter, CallRecord};

#[derive(Debug, Clone)]
pub struct AwsClients {
    pub dynamo: aws_sdk_dynamodb::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub s3: aws_sdk_s3::Client,
    pub ecs: aws_sdk_ecs::Client,
    pub ses: aws_sdk_sesv2::Client,
    pub sdk_config: aws_config::SdkConfig,
    pub calls: CallCounter,
}

impl AwsClients {
    /// Loads the default chain; `endpoint` overrides `AWS_ENDPOINT_URL`.
    pub async fn load(endpoint: Option<&str>) -> Self {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(ep) = endpoint {
            loader = loader.endpoint_url(ep);
        }
        let sdk_config = loader.load().await;
        Self::from_sdk_config(sdk_config)
    }

    pub fn from_sdk_config(sdk_config: aws_config::SdkConfig) -> Self {
        let calls = CallCounter::default();
        let dynamo = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&sdk_config)
                .interceptor(calls.clone())
                .build(),
        );
        let sqs = aws_sdk_sqs::Client::from_conf(
            aws_sdk_sqs::config::Builder::from(&sdk_config)
                .interceptor(calls.clone())
                .build(),
        );
        // Emulators serve buckets by path, not by virtual host.
        let path_style = sdk_config.endpoint_url().is_some();
        let s3 = aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&sdk_config)
                .force_path_style(path_style)
                .interceptor(calls.clone())
                .build(),
        );
        let ecs = aws_sdk_ecs::Client::from_conf(
            aws_sdk_ecs::config::Builder::from(&sdk_config)
                .interceptor(calls.clone())
                .build(),
        );
        let ses = aws_sdk_sesv2::Client::from_conf(
            aws_sdk_sesv2::config::Builder::from(&sdk_config)
                .interceptor(calls.clone())
                .build(),
        );
        AwsClients {
            dynamo,
            sqs,
            s3,
            ecs,
            ses,
            sdk_config,
            calls,
        }
    }
}

impl AwsClients {
    /// Clients for an emulator: explicit endpoint and region, and dummy
    /// credentials unless real ones are in the environment.
    pub async fn load_local(endpoint: &str, region: &str) -> Self {
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .endpoint_url(endpoint)
            .region(aws_config::Region::new(region.to_string()));
        if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
            loader = loader.credentials_provider(aws_sdk_sqs::config::Credentials::new(
                "test",
                "test",
                None,
                None,
                "armada-local",
            ));
        }
        Self::from_sdk_config(loader.load().await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_counter_sees_every_call_even_failed_ones() {
        // Nothing listens on port 9: the call fails, but it was made.
        let aws = AwsClients::load_local("http://127.0.0.1:9", "us-east-1").await;
        aws.calls.start_log();
        let _ = aws.dynamo.get_item().table_name("t").send().await;
        let _ = aws.sqs.get_queue_url().queue_name("q").send().await;
        assert_eq!(aws.calls.snapshot().get("DynamoDB.GetItem"), Some(&1));
        let log = aws.calls.drain_log();
        let ops: Vec<&str> = log.iter().map(|c| c.op.as_str()).collect();
        assert_eq!(ops, ["DynamoDB.GetItem", "SQS.GetQueueUrl"]);
        assert!(log.iter().all(|c| c.end.is_some()), "failed calls end too");
        assert_eq!(aws.calls.take_log(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn a_call_is_for_the_run_its_work_is_for_even_if_named_later() {
        let aws = AwsClients::load_local("http://127.0.0.1:9", "us-east-1").await;
        aws.calls.start_log();
        let id = format!("run_{}", "ab".repeat(16));
        crate::calls::on_behalf(None, async {
            let _ = aws.dynamo.get_item().table_name("registry").send().await;
            crate::calls::name_run(&id);
        })
        .await;
        let _ = aws.dynamo.get_item().table_name("registry").send().await;
        let log = aws.calls.drain_log();
        assert_eq!(log[0].runs, [id]);
        assert!(log[1].runs.is_empty(), "outside the work, nobody's");
    }
}
