//! Named moments of the functions' work where a fault can be injected:
//! the harness's step (its claim, the model's reply, a sandbox task's
//! start, a sandbox dispatch, its commit, children's ends noted on their
//! parent), the dispatcher's start of children, and an approval's
//! decision. Each is a place where a
//! process dying leaves a half-done change that another delivery must
//! finish exactly once; `armada chaos` kills the functions host there and
//! checks that it does. A deployment meets every point with [`NoFaults`].

use futures::future::BoxFuture;

/// The work was aborted the way a Lambda dies: nothing acknowledged,
/// nothing more committed, any lease left to expire.
#[derive(Debug, thiserror::Error)]
#[error("aborted at a fault point: {0}")]
pub struct Aborted(pub String);

/// A named fault point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultPoint {
    /// A step is claimed (its lease and epoch written); nothing else is
    /// done. A decided approval is applied from here too.
    AfterClaim,
    /// The model answered; nothing of its answer is committed.
    AfterModelReply,
    /// A sandbox's task was started (the provider answered); its record
    /// does not name the task yet.
    AfterTaskStart,
    /// A sandbox call was sent to its sandbox; the dispatch is not
    /// recorded.
    AfterSandboxDispatch,
    /// A step's outcome is committed; what follows it (the next step's
    /// message, the end announced, the children asked for) is not sent.
    AfterCommit,
    /// The dispatcher created a waiting parent's children and sent their
    /// starts; the parent does not record them as started yet.
    AfterChildSpawn,
    /// Children's ends are committed on their parent (a team's round
    /// complete, an aggregation due); what follows (round 2's step, the
    /// next child's start) is not sent.
    AfterChildEnds,
    /// An approval's decision is stored; its Run is not told yet.
    AfterApprovalDecided,
}

impl FaultPoint {
    pub const ALL: [FaultPoint; 8] = [
        FaultPoint::AfterClaim,
        FaultPoint::AfterModelReply,
        FaultPoint::AfterTaskStart,
        FaultPoint::AfterSandboxDispatch,
        FaultPoint::AfterCommit,
        FaultPoint::AfterChildSpawn,
        FaultPoint::AfterChildEnds,
        FaultPoint::AfterApprovalDecided,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FaultPoint::AfterClaim => "after_claim",
            FaultPoint::AfterModelReply => "after_model_reply",
            FaultPoint::AfterTaskStart => "after_task_start",
            FaultPoint::AfterSandboxDispatch => "after_sandbox_dispatch",
            FaultPoint::AfterCommit => "after_commit",
            FaultPoint::AfterChildSpawn => "after_child_spawn",
            FaultPoint::AfterChildEnds => "after_child_ends",
            FaultPoint::AfterApprovalDecided => "after_approval_decided",
        }
    }
}

/// What meets the fault points.
pub trait FaultPoints: Send + Sync + std::fmt::Debug {
    /// Called at each named point with the Run concerned; an error aborts
    /// the work as a dying process would, a future that never ends holds
    /// it there (until the process is killed under it).
    fn at<'a>(&'a self, point: FaultPoint, run_id: &'a str) -> BoxFuture<'a, Result<(), Aborted>>;
}

/// Every point passed at once: a deployment's.
#[derive(Debug, Default)]
pub struct NoFaults;

impl FaultPoints for NoFaults {
    fn at<'a>(
        &'a self,
        _point: FaultPoint,
        _run_id: &'a str,
    ) -> BoxFuture<'a, Result<(), Aborted>> {
        Box::pin(async { Ok(()) })
    }
}

/// Dies once, at `point`, as a process killed there would (unit tests).
#[cfg(any(test, feature = "test-support"))]
#[derive(Debug)]
pub struct DiesOnceAt {
    point: FaultPoint,
    died: std::sync::atomic::AtomicBool,
}

#[cfg(any(test, feature = "test-support"))]
impl DiesOnceAt {
    pub fn new(point: FaultPoint) -> Self {
        DiesOnceAt {
            point,
            died: Default::default(),
        }
    }

    /// Whether it has died yet.
    pub fn died(&self) -> bool {
        self.died.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[cfg(any(test, feature = "test-support"))]
impl FaultPoints for DiesOnceAt {
    fn at<'a>(&'a self, point: FaultPoint, _run_id: &'a str) -> BoxFuture<'a, Result<(), Aborted>> {
        let dies =
            point == self.point && !self.died.swap(true, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move {
            if dies {
                Err(Aborted(format!("killed {}", point.as_str())))
            } else {
                Ok(())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_has_its_own_name() {
        let names: std::collections::BTreeSet<&str> =
            FaultPoint::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(names.len(), FaultPoint::ALL.len());
    }

    #[tokio::test]
    async fn a_deployment_passes_every_point() {
        for p in FaultPoint::ALL {
            assert!(NoFaults.at(p, "run_1").await.is_ok());
        }
    }
}
