//! Errors at the AWS boundary, classified once where they enter: a typed
//! conflict for failed conditions, retryable for throttling and transport,
//! terminal for the rest.

use aws_sdk_dynamodb::error::SdkError;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A conditional write's condition did not hold (optimistic concurrency,
    /// fencing, duplicate creation). `which` names the failed item of a
    /// transaction, in the order the items were given.
    #[error("condition failed (item {which:?})")]
    Conflict { which: Option<usize> },
    /// Worth retrying: throttling, timeouts, the service or emulator unreachable.
    #[error("retryable AWS error: {0}")]
    Retryable(String),
    /// Not worth retrying: validation, missing resources, bad data.
    #[error("AWS error: {0}")]
    Terminal(String),
    /// An item whose shape we do not recognise.
    #[error("corrupt record: {0}")]
    Corrupt(String),
}

impl StoreError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Retryable(_))
    }
}

const RETRYABLE_CODES: [&str; 8] = [
    "ThrottlingException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionConflictException",
    "RequestThrottled",
    "InternalError",
];

/// Classifies any SDK error by its code and kind.
pub fn classify<E>(err: SdkError<E, aws_smithy_runtime_api::http::Response>) -> StoreError
where
    E: aws_smithy_types::error::metadata::ProvideErrorMetadata + std::error::Error + 'static,
{
    match &err {
        SdkError::ServiceError(se) => {
            let code = se.err().code().unwrap_or("Unknown");
            let msg = se.err().message().unwrap_or("").to_string();
            if code == "ConditionalCheckFailedException" {
                StoreError::Conflict { which: None }
            } else if RETRYABLE_CODES.contains(&code) || se.raw().status().is_server_error() {
                StoreError::Retryable(format!("{code}: {msg}"))
            } else {
                StoreError::Terminal(format!("{code}: {msg}"))
            }
        }
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            StoreError::Retryable(format!(
                "{}",
                aws_smithy_types::error::display::DisplayErrorContext(&err)
            ))
        }
        _ => StoreError::Terminal(format!(
            "{}",
            aws_smithy_types::error::display::DisplayErrorContext(&err)
        )),
    }
}

/// A store error as the API shows it: retry later, or an internal error
/// (the detail goes to the log, never to the caller).
impl From<StoreError> for armada_api::ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Retryable(m) => {
                tracing::warn!(error = %m, "store unavailable");
                armada_api::ApiError::unavailable("the service is briefly unavailable; retry")
            }
            other => {
                tracing::error!(error = %other, "store error");
                armada_api::ApiError::internal()
            }
        }
    }
}
