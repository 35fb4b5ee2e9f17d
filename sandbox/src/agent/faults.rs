//! Faults the tests inject through the task's environment (the local data
//! plane passes them on). Compiled in only with the `test-faults` feature,
//! which the workspace's tests turn on as a dev-dependency: release builds
//! never enable it, and without it these are no-ops.

use super::Invocation;

/// `ARMADA_TEST_STALL_AGENT=<agent>`: that agent's sandbox never starts.
#[cfg(feature = "test-faults")]
pub fn stall_at_start(agent: &str) -> bool {
    std::env::var("ARMADA_TEST_STALL_AGENT").is_ok_and(|a| a == agent)
}

#[cfg(not(feature = "test-faults"))]
pub fn stall_at_start(_agent: &str) -> bool {
    false
}

/// `ARMADA_TEST_PANIC_ON=<marker>`: the agent panics in a call whose
/// arguments contain the marker.
#[cfg(feature = "test-faults")]
pub fn panic_on(inv: &Invocation) {
    if let Ok(marker) = std::env::var("ARMADA_TEST_PANIC_ON") {
        if !marker.is_empty() && inv.args.to_string().contains(&marker) {
            panic!("injected panic in call {}", inv.call_id);
        }
    }
}

#[cfg(not(feature = "test-faults"))]
pub fn panic_on(_inv: &Invocation) {}
