//! The hitl Lambda: `lambda_http` around [`armada_hitl::handle`].

use std::convert::Infallible;

use lambda_http::{service_fn, Error, Request};

#[tokio::main]
async fn main() -> Result<(), Error> {
    armada_core::telemetry::init();
    let svc = armada_core::Services::from_env().await?;
    lambda_http::run(service_fn(move |req: Request| {
        let svc = svc.clone();
        async move { Ok::<_, Infallible>(armada_hitl::handle(svc, req).await) }
    }))
    .await
}
