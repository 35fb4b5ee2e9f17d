//! The integration tests, in one binary (as cargo's own `tests/testsuite`):
//! one module per area, every test against the emulator this process
//! starts once (each test on a local stack of its own, sharing no
//! resources). `emulator.rs` and `restart.rs` stay binaries of their own:
//! one measures its emulator's CPU, the other restarts it.

#[path = "alarms.rs"]
mod alarms;
#[path = "alerts.rs"]
mod alerts;
#[path = "api.rs"]
mod api;
#[path = "approvals.rs"]
mod approvals;
#[path = "approvals_sandbox.rs"]
mod approvals_sandbox;
#[path = "browser.rs"]
mod browser;
#[path = "chaos.rs"]
mod chaos;
#[path = "collaboration.rs"]
mod collaboration;
#[path = "contract.rs"]
mod contract;
#[path = "dataplane_isolation.rs"]
mod dataplane_isolation;
#[path = "egress.rs"]
mod egress;
#[path = "fargate_mode.rs"]
mod fargate_mode;
#[path = "faults.rs"]
mod faults;
#[path = "hooks.rs"]
mod hooks;
#[path = "identity.rs"]
mod identity;
#[path = "layout.rs"]
mod layout;
#[path = "mail.rs"]
mod mail;
#[path = "mcp.rs"]
mod mcp;
#[path = "mcp_ledger.rs"]
mod mcp_ledger;
#[path = "mcp_sandbox.rs"]
mod mcp_sandbox;
#[path = "outcomes.rs"]
mod outcomes;
#[path = "programs.rs"]
mod programs;
#[path = "relay.rs"]
mod relay;
#[path = "sandbox_failures.rs"]
mod sandbox_failures;
#[path = "sandbox_image.rs"]
mod sandbox_image;
#[path = "sandboxes.rs"]
mod sandboxes;
#[path = "schedules.rs"]
mod schedules;
#[path = "secrets.rs"]
mod secrets;
#[path = "sessions.rs"]
mod sessions;
#[path = "task_network.rs"]
mod task_network;
#[path = "template.rs"]
mod template;
