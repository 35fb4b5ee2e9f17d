//! The harness Lambda: one Run step per SQS record.

use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    armada_core::telemetry::init();
    let svc = armada_core::Services::from_env().await?;
    let harness = Arc::new(armada_harness::Harness::new(svc));
    lambda_runtime::run(service_fn(move |ev: LambdaEvent<SqsEvent>| {
        let harness = harness.clone();
        async move { Ok::<_, Error>(harness.handle_event(ev.payload).await?) }
    }))
    .await
}
