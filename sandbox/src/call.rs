//! One call as the runner runs it: what to run (an [`Action`]), for which
//! Run, with what input, time, ports, environment and effect layers.

use std::time::Duration;

use crate::jail::Action;

/// One call to run.
#[derive(Debug, Clone)]
pub struct Call {
    pub action: Action,
    pub run_id: String,
    pub stdin: Option<Vec<u8>>,
    pub timeout: Duration,
    /// Ports the call may bind (a `serve` call's pooled port).
    pub bind_ports: Vec<u16>,
    pub env: Vec<(String, String)>,
    /// The layers of an overlay over the workspace that take the call's
    /// changes, to be judged ([`crate::effects`]).
    pub effects: Option<crate::jail::OverlayLayers>,
}

impl Call {
    /// The probe the agent confines at start to measure its controls: it
    /// does nothing (`/bin/true`), so what the jail reports is the point.
    pub fn probe() -> Call {
        Call {
            action: Action::Exec {
                argv: vec!["/bin/true".into()],
            },
            run_id: "probe".into(),
            stdin: None,
            timeout: Duration::from_secs(30),
            bind_ports: vec![],
            env: vec![],
            effects: None,
        }
    }
}
