//! AgentSession: a header plus one item per turn. Messages are numbered as
//! they are accepted (`next_seq`); `done_seq` counts the leading messages
//! whose Runs have ended. A message's Run starts only when every earlier
//! message's Run has ended, so a session answers one message at a time, in order.

use serde::{Deserialize, Serialize};

#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBusy {
    /// A message sent while a Run is active waits for it.
    Queue,
    /// A message sent while a Run is active is refused with 409.
    Reject,
}

impl OnBusy {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "queue" => Some(OnBusy::Queue),
            "reject" => Some(OnBusy::Reject),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            OnBusy::Queue => "queue",
            OnBusy::Reject => "reject",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionHeader {
    pub session_id: String,
    pub tenant: String,
    pub agent: String,
    pub on_busy: OnBusy,
    /// Messages accepted so far; the next message gets `next_seq + 1`.
    pub next_seq: u64,
    /// The leading messages whose Runs have ended.
    pub done_seq: u64,
    pub created_at_ms: i64,
}

impl SessionHeader {
    pub fn busy(&self) -> bool {
        self.next_seq > self.done_seq
    }

    /// Whether the Run of message `seq` may start now.
    pub fn may_start(&self, seq: u64) -> bool {
        seq == self.done_seq + 1
    }
}

/// What to do when the Run of message `seq` has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// Mark messages up to `seq` done, then look at message `seq + 1`.
    To { seq: u64 },
    /// Already counted (a duplicate notification).
    AlreadyDone,
    /// An earlier message is still running (a queued message was cancelled);
    /// it will be passed over when the session reaches it.
    NotYet,
}

pub fn advance(header: &SessionHeader, ended_seq: u64) -> Advance {
    if ended_seq <= header.done_seq {
        Advance::AlreadyDone
    } else if ended_seq == header.done_seq + 1 {
        Advance::To { seq: ended_seq }
    } else {
        Advance::NotYet
    }
}

/// Turn numbers: the header is turn 0; message `seq` contributes the user
/// turn `2*seq - 1` and the assistant turn `2*seq`, so writing them twice is
/// harmless and history stays in message order.
pub fn turn_numbers(seq: u64) -> (u64, u64) {
    (2 * seq - 1, 2 * seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(next: u64, done: u64) -> SessionHeader {
        SessionHeader {
            session_id: "s".into(),
            tenant: "t".into(),
            agent: "a".into(),
            on_busy: OnBusy::Queue,
            next_seq: next,
            done_seq: done,
            created_at_ms: 0,
        }
    }

    #[test]
    fn messages_start_in_order() {
        let h = header(3, 1);
        assert!(h.busy());
        assert!(h.may_start(2));
        assert!(!h.may_start(3));
        assert_eq!(advance(&h, 2), Advance::To { seq: 2 });
        assert_eq!(advance(&h, 1), Advance::AlreadyDone);
        assert_eq!(advance(&h, 3), Advance::NotYet);
        assert!(!header(2, 2).busy());
    }
}
