//! The ingress Lambda: [`armada_ingress::app`] served by `lambda_http`.

use lambda_http::Error;

#[tokio::main]
async fn main() -> Result<(), Error> {
    armada_core::telemetry::init();
    let svc = armada_core::Services::from_env().await?;
    lambda_http::run(armada_ingress::app(svc)).await
}
