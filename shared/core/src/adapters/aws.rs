//! AWS clients, built once per process from the default credential chain.
//! `AWS_ENDPOINT_URL` (or an explicit endpoint) points every client at an
//! emulator; an interceptor counts API calls per service and operation for
//! `armada bench`.

use std::sync::{Arc, RwLock};

use aws_config::BehaviorVersion;
use aws_credential_types::provider::{self, ProvideCredentials};
use aws_credential_types::Credentials;

use armada_domain::sandbox::credentials::TaskCredentials;

pub use crate::adapters::calls::{CallCounter, CallRecord};

#[derive(Debug, Clone)]
pub struct AwsClients {
    pub dynamo: aws_sdk_dynamodb::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub s3: aws_sdk_s3::Client,
    pub ecs: aws_sdk_ecs::Client,
    pub ses: aws_sdk_sesv2::Client,
    pub sts: aws_sdk_sts::Client,
    /// EventBridge Scheduler: the timers of schedules.
    pub scheduler: aws_sdk_scheduler::Client,
    /// SNS: the alarm topics of cloudwatch hooks.
    pub sns: aws_sdk_sns::Client,
    /// KMS: the data keys of tenants' secrets.
    pub kms: aws_sdk_kms::Client,
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
        let sts = aws_sdk_sts::Client::from_conf(
            aws_sdk_sts::config::Builder::from(&sdk_config)
                .interceptor(calls.clone())
                .build(),
        );
        let scheduler = aws_sdk_scheduler::Client::from_conf(
            aws_sdk_scheduler::config::Builder::from(&sdk_config)
                .interceptor(calls.clone())
                .build(),
        );
        let sns = aws_sdk_sns::Client::from_conf(
            aws_sdk_sns::config::Builder::from(&sdk_config)
                .interceptor(calls.clone())
                .build(),
        );
        let kms = aws_sdk_kms::Client::from_conf(
            aws_sdk_kms::config::Builder::from(&sdk_config)
                .interceptor(calls.clone())
                .build(),
        );
        AwsClients {
            sns,
            kms,
            dynamo,
            sqs,
            s3,
            ecs,
            ses,
            sts,
            scheduler,
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

/// Credentials that can be replaced while the clients using them live: a
/// sandbox agent's, renewed before they expire. The clients are built
/// without an identity cache, so every request asks for the current ones.
#[derive(Debug, Clone)]
pub struct HeldCredentials(Arc<RwLock<TaskCredentials>>);

impl HeldCredentials {
    pub fn new(c: TaskCredentials) -> Self {
        HeldCredentials(Arc::new(RwLock::new(c)))
    }

    /// From now on every request is signed with `c`.
    pub fn replace(&self, c: TaskCredentials) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = c;
    }

    /// The ones in use.
    pub fn current(&self) -> TaskCredentials {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl ProvideCredentials for HeldCredentials {
    fn provide_credentials<'a>(&'a self) -> provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        let c = self.current();
        let expiry = std::time::UNIX_EPOCH
            + std::time::Duration::from_millis(u64::try_from(c.expires_at_ms).unwrap_or(0));
        provider::future::ProvideCredentials::ready(Ok(Credentials::new(
            c.access_key_id,
            c.secret_access_key,
            Some(c.session_token),
            Some(expiry),
            "armada-sandbox",
        )))
    }
}

impl AwsClients {
    /// Clients signing with `held` (whatever it holds at each request);
    /// endpoint and region from the environment as usual.
    pub async fn load_held(held: HeldCredentials) -> Self {
        let loader = aws_config::defaults(BehaviorVersion::latest())
            .credentials_provider(held)
            .identity_cache(aws_config::identity::IdentityCache::no_cache());
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
        crate::adapters::calls::on_behalf(None, async {
            let _ = aws.dynamo.get_item().table_name("registry").send().await;
            crate::adapters::calls::name_run(&id);
        })
        .await;
        let _ = aws.dynamo.get_item().table_name("registry").send().await;
        let log = aws.calls.drain_log();
        assert_eq!(log[0].runs, [id]);
        assert!(log[1].runs.is_empty(), "outside the work, nobody's");
    }
}
