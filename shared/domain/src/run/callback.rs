//! A Run's callback: its outcome POSTed to the `callback_url` it was
//! started with, signed per Standard Webhooks, tried until the receiver
//! takes it, says it never will, or a day (the policy's `max_age_s`) has
//! passed. The record lives on the Run that carries the delivery and
//! changes only through its machine: each attempt's outcome decides
//! whether it is delivered, failed, or tried again after a backoff.
//!
//! - `2xx`: delivered.
//! - `410 Gone`: failed at once (the receiver is gone for good).
//! - another `4xx` but `408` and `429`: failed (it will not get better).
//! - a target the egress guard refuses: failed.
//! - anything else (`5xx`, `408`, `429`, no answer): tried again after
//!   `base_s · 2^(attempts-1)`, ±20% jitter, until `max_age_s` from the
//!   first attempt; then failed, and dead-lettered.

use serde::{Deserialize, Serialize};

use super::family::ChainState;
use crate::crypto::sha256_hex;

/// How a deployment retries callbacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallbackPolicy {
    /// The first retry's delay; each later one doubles it.
    pub base_s: u32,
    /// How long after the first attempt the last may be.
    pub max_age_s: u32,
}

#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallbackState {
    /// Not tried yet.
    Pending,
    /// Tried, and to be tried again at `next_attempt_at_ms`.
    Retrying,
    Delivered,
    Failed,
}

impl CallbackState {
    pub fn is_final(self) -> bool {
        matches!(self, CallbackState::Delivered | CallbackState::Failed)
    }
}

/// One callback delivery of a Run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackRecord {
    /// The `webhook-id` of every attempt (the Run's id, or its chain's).
    pub delivery_id: String,
    /// The chain's end this delivers, when it is a chain's outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<ChainState>,
    state: CallbackState,
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<u16>,
    /// A coarse reason for the last failure (`HTTP_503`, `CONNECT_FAILED`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the first attempt of this round was made (a redelivery starts
    /// a new round).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_attempt_at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at_ms: Option<i64>,
}

/// How one attempt went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub delivered: bool,
    pub status: Option<u16>,
    pub error: Option<String>,
    /// The egress guard refused the target: no attempt can succeed.
    pub refused: bool,
}

/// What a callback's machine is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallbackEvent {
    Attempted {
        attempt: Attempt,
        policy: CallbackPolicy,
    },
    /// Someone asks for a failed delivery to be tried again.
    Redeliver,
}

/// What the handler does once the change is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallbackAction {
    /// Try again in this many seconds.
    RetryIn(u32),
    /// Record `callback_delivered`.
    Delivered,
    /// Record `callback_failed`; `dead_letter` when it ran out of time
    /// (the message goes to the dead-letter queue).
    Failed { dead_letter: bool },
    /// Send the delivery now (a redelivery).
    Send,
}

/// Why a callback refused an event (nothing changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CallbackRefusal {
    #[error("the callback was {0:?} already")]
    Final(CallbackState),
    #[error("only a failed callback is delivered again; this one is {0:?}")]
    NotFailed(CallbackState),
}

impl CallbackRecord {
    pub fn new(delivery_id: &str, chain: Option<ChainState>) -> CallbackRecord {
        CallbackRecord {
            delivery_id: delivery_id.to_string(),
            chain,
            state: CallbackState::Pending,
            attempts: 0,
            last_status: None,
            last_error: None,
            first_attempt_at_ms: None,
            next_attempt_at_ms: None,
        }
    }

    pub fn state(&self) -> CallbackState {
        self.state
    }

    /// The delay before retry `attempts + 1`: `base · 2^(attempts-1)`
    /// seconds with ±20% jitter fixed by the delivery and the attempt (so
    /// receivers are not hit in lockstep, and a decision reads the same
    /// when it is made again).
    fn backoff_s(&self, base_s: u32) -> u32 {
        let doubling = self.attempts.saturating_sub(1).min(20);
        let plain = u64::from(base_s.max(1)).saturating_mul(1 << doubling);
        let seed = sha256_hex(format!("{}#{}", self.delivery_id, self.attempts).as_bytes());
        let spread = u64::from_str_radix(&seed[..4], 16).unwrap_or(0) % 41; // 0..=40
        let jittered = plain.saturating_mul(80 + spread) / 100;
        u32::try_from(jittered.max(1)).unwrap_or(u32::MAX)
    }
}

impl crate::machine::Machine for CallbackRecord {
    type Event = CallbackEvent;
    type Action = CallbackAction;
    type Refusal = CallbackRefusal;
    /// Written with the Run that carries it, on the Run's stamp.
    type Version = ();

    fn apply(
        &mut self,
        event: CallbackEvent,
        now_ms: i64,
    ) -> Result<Vec<CallbackAction>, CallbackRefusal> {
        match (self.state, event) {
            (
                CallbackState::Pending | CallbackState::Retrying,
                CallbackEvent::Attempted { attempt, policy },
            ) => {
                let first = *self.first_attempt_at_ms.get_or_insert(now_ms);
                self.attempts += 1;
                self.last_status = attempt.status;
                self.last_error = attempt.error.clone();
                self.next_attempt_at_ms = None;
                if attempt.delivered {
                    self.state = CallbackState::Delivered;
                    self.last_error = None;
                    return Ok(vec![CallbackAction::Delivered]);
                }
                let final_status = attempt
                    .status
                    .is_some_and(|s| (400..500).contains(&s) && s != 408 && s != 429);
                if attempt.refused || final_status {
                    self.state = CallbackState::Failed;
                    return Ok(vec![CallbackAction::Failed { dead_letter: false }]);
                }
                let deadline = first + i64::from(policy.max_age_s) * 1000;
                let left_s = (deadline - now_ms).div_euclid(1000);
                if left_s < 1 {
                    self.state = CallbackState::Failed;
                    return Ok(vec![CallbackAction::Failed { dead_letter: true }]);
                }
                let delay = self
                    .backoff_s(policy.base_s)
                    .min(u32::try_from(left_s).unwrap_or(u32::MAX));
                self.state = CallbackState::Retrying;
                self.next_attempt_at_ms = Some(now_ms + i64::from(delay) * 1000);
                Ok(vec![CallbackAction::RetryIn(delay)])
            }
            (CallbackState::Failed, CallbackEvent::Redeliver) => {
                self.state = CallbackState::Pending;
                self.first_attempt_at_ms = None;
                self.next_attempt_at_ms = None;
                Ok(vec![CallbackAction::Send])
            }
            (
                state @ (CallbackState::Pending
                | CallbackState::Retrying
                | CallbackState::Delivered),
                CallbackEvent::Redeliver,
            ) => Err(CallbackRefusal::NotFailed(state)),
            (
                state @ (CallbackState::Delivered | CallbackState::Failed),
                CallbackEvent::Attempted { .. },
            ) => Err(CallbackRefusal::Final(state)),
        }
    }

    fn version(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Machine;

    const POLICY: CallbackPolicy = CallbackPolicy {
        base_s: 10,
        max_age_s: 86_400,
    };

    fn attempt(status: Option<u16>) -> CallbackEvent {
        CallbackEvent::Attempted {
            attempt: Attempt {
                delivered: status.is_some_and(|s| (200..300).contains(&s)),
                status,
                error: status.map_or(Some("CONNECT_FAILED".into()), |s| Some(format!("HTTP_{s}"))),
                refused: false,
            },
            policy: POLICY,
        }
    }

    #[test]
    fn failures_back_off_exponentially_with_jitter_until_delivered() {
        let mut cb = CallbackRecord::new("run_1", None);
        let mut now = 1_000_000;
        let mut delays = Vec::new();
        for status in [Some(500), None, Some(429), Some(408)] {
            let actions = cb.apply(attempt(status), now).unwrap();
            let [CallbackAction::RetryIn(d)] = actions[..] else {
                panic!("{actions:?}")
            };
            assert_eq!(cb.state(), CallbackState::Retrying);
            assert_eq!(cb.next_attempt_at_ms, Some(now + i64::from(d) * 1000));
            delays.push(d);
            now += i64::from(d) * 1000;
        }
        for (i, d) in delays.iter().enumerate() {
            let plain = 10 << i;
            assert!(
                (plain * 8 / 10..=plain * 12 / 10).contains(d),
                "{i}: {d} vs {plain}"
            );
        }
        assert_eq!(
            cb.apply(attempt(Some(200)), now),
            Ok(vec![CallbackAction::Delivered])
        );
        assert_eq!(
            (cb.state(), cb.attempts, cb.last_status),
            (CallbackState::Delivered, 5, Some(200))
        );
        assert_eq!(
            cb.apply(attempt(Some(500)), now),
            Err(CallbackRefusal::Final(CallbackState::Delivered))
        );
    }

    #[test]
    fn gone_and_other_client_errors_fail_at_once() {
        for status in [410, 400, 404, 401] {
            let mut cb = CallbackRecord::new("run_1", None);
            assert_eq!(
                cb.apply(attempt(Some(status)), 0),
                Ok(vec![CallbackAction::Failed { dead_letter: false }])
            );
            assert_eq!(cb.state(), CallbackState::Failed);
        }
        let mut cb = CallbackRecord::new("run_1", None);
        let refused = CallbackEvent::Attempted {
            attempt: Attempt {
                delivered: false,
                status: None,
                error: Some("EGRESS_REFUSED".into()),
                refused: true,
            },
            policy: POLICY,
        };
        assert_eq!(
            cb.apply(refused, 0),
            Ok(vec![CallbackAction::Failed { dead_letter: false }])
        );
    }

    #[test]
    fn it_gives_up_after_a_day_and_can_be_delivered_again() {
        let mut cb = CallbackRecord::new("run_1", None);
        let start = 5_000;
        cb.apply(attempt(Some(503)), start).unwrap();
        // However many tries, none is scheduled past the day.
        let mut now = start;
        loop {
            match cb.apply(attempt(Some(503)), now).unwrap()[..] {
                [CallbackAction::RetryIn(d)] => {
                    assert!(now + i64::from(d) * 1000 <= start + 86_400_000);
                    now += i64::from(d) * 1000;
                }
                [CallbackAction::Failed { dead_letter: true }] => break,
                ref other => panic!("{other:?}"),
            }
        }
        assert!(now >= start + 86_399_000, "{now}");
        assert_eq!(cb.state(), CallbackState::Failed);
        assert_eq!(
            cb.apply(CallbackEvent::Redeliver, now),
            Ok(vec![CallbackAction::Send])
        );
        assert_eq!(
            (cb.state(), cb.first_attempt_at_ms),
            (CallbackState::Pending, None)
        );
        assert_eq!(
            cb.apply(CallbackEvent::Redeliver, now),
            Err(CallbackRefusal::NotFailed(CallbackState::Pending))
        );
    }
}
