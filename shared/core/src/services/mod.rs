//! Application services: what more than one function does with the
//! ports, written once (handlers call these, never each other).

pub mod auth;
pub mod callbacks;
pub mod deliveries;
pub mod egress;
pub mod ending;
pub mod inbox;
pub mod mcp;
pub mod mcp_sessions;
pub mod sandboxing;
pub mod secrets;
pub mod starting;
pub mod tools;
pub mod unreadable;
