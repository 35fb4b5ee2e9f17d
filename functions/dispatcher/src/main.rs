//! The dispatcher Lambda: dispatch queue and both dead-letter queues.

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    armada_core::telemetry::init();
    let svc = armada_core::Services::from_env().await?;
    let dispatcher = armada_dispatcher::Dispatcher::new(svc);
    lambda_runtime::run(service_fn(move |ev: LambdaEvent<SqsEvent>| {
        let d = dispatcher.clone();
        async move { Ok::<_, Error>(d.handle_event(ev.payload).await) }
    }))
    .await
}
