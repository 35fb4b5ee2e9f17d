//! The hitl Lambda: [`armada_hitl::app`] served by `lambda_http`.

use lambda_http::Error;

#[tokio::main]
async fn main() -> Result<(), Error> {
    armada_core::telemetry::init();
    let svc = armada_core::Services::from_env().await?;
    lambda_http::run(armada_hitl::app(svc)).await
}
