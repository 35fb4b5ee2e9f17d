//! The `armada` command line: the local stack (`up`, `down`) and a thin
//! client of the HTTP API (`ask`, `chat`, `runs`, `agents`).
//!
//! - [`local`]: emulator, template-driven provisioning, in-process handlers,
//!   API Gateway-like HTTP server, Lambda-like SQS pollers, scripted model
//! - [`client`]: the HTTP API client the commands use
//! - [`up`]: `armada up` (foreground or detached) and `armada down`
//! - [`demo`]: `armada up --demo`; [`tree`]: `armada runs tree`
//! - [`bench`]: `armada bench`
//! - [`openapi`]: the API's OpenAPI document (`armada openapi`)

pub mod bench;
pub mod chaos;
pub mod client;
pub mod demo;
pub mod hooks;
pub mod local;
pub mod mailboxes;
pub mod openapi;
pub mod rng;
pub mod schedules;
pub mod skills;
pub mod tree;
pub mod up;
