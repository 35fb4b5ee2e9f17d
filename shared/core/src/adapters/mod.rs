//! The adapters: each implements ports of [`crate::ports`] over an AWS
//! service (or, for models, an HTTP endpoint). They own the SDK types and
//! the mapping to and from the domain's; nothing above them sees either.

pub mod aws;
pub mod calls;
pub mod dynamo;
pub mod ecs;
pub mod kms;
pub mod models;
pub mod s3;
pub mod scheduler;
pub mod ses;
pub mod sns;
pub mod sqs;
pub mod vault;
