//! The hitl Lambda: `lambda_http` around [`armada_hitl::handle`].

use std::convert::Infallible;

use lambda_http::{service_fn, Error, Request};

#[tokio::main]
async fn main() -> Result<(), Error> {
    armada_core::telemetry::init();
    lambda_http::run(service_fn(|req: Request| async move {
        Ok::<_, Infallible>(armada_hitl::handle(req).await)
    }))
    .await
}
