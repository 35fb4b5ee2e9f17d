//! Logging: JSON lines in Lambda (`ARMADA_LOG_FORMAT=json`), text locally.

pub fn init() {
    init_with("info");
}

/// As [`init`], with `default` as the filter when `RUST_LOG` is unset.
pub fn init_with(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let json = std::env::var("ARMADA_LOG_FORMAT").is_ok_and(|v| v == "json");
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    let _ = if json {
        builder
            .json()
            .with_current_span(true)
            .without_time()
            .try_init()
    } else {
        builder.try_init()
    };
}
