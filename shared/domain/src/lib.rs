//! The Armada domain: Runs and their state machine, the tool-call ledger,
//! sessions, agent definitions, context assembly, the scripted model and the
//! API's request and error vocabulary. No AWS type appears here; adapters in
//! `armada-core` map these to DynamoDB items and queue messages.
//!
//! - [`run`]: the Run record, states, transitions, claim classification
//! - [`ledger`]: tool calls `PLANNED → DISPATCHED → DONE | FAILED | INDETERMINATE`
//! - [`step`]: one harness step decided: budgets, deadline, which tools run where, what next
//! - [`approval`]: human approvals: which calls need one, the record and its decisions
//! - [`collab`]: delegation, teams' children and rounds, the DelegationTrace
//! - [`session`]: AgentSession ordering
//! - [`context`]: prompt assembly and compaction
//! - [`messages`]: queue message contracts
//! - [`agent`], [`skills`], [`team`]: registry data
//! - [`hook`]: inbound webhooks: the hook record, signatures, deliveries
//! - [`mailbox`]: mailboxes: inbound mail read, who may write, threaded replies
//! - [`schedule`]: schedules: EventBridge Scheduler's expressions, the record, firings
//! - [`sandbox`]: skill placement, limits, ports, capability profiles, mount policy
//! - [`api`], [`fields`]: request validation, errors, API keys
//! - [`chat`], [`scripted`]: the model port's vocabulary and the scripted model

pub mod agent;
pub mod api;
pub mod approval;
pub mod chat;
pub mod collab;
pub mod context;
pub mod crypto;
pub mod dead_letter;
pub mod egress;
pub mod fields;
pub mod hook;
pub mod ledger;
pub mod machine;
pub mod mailbox;
pub mod mcp;
pub mod messages;
pub mod names;
pub mod program;
pub mod run;
pub mod sandbox;
pub mod schedule;
pub mod scripted;
pub mod secret;
pub mod served;
pub mod session;
pub mod skill_files;
pub mod skills;
pub mod step;
pub mod team;
