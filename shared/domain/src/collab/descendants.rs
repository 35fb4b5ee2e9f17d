//! The Runs one root's tree may have below the root, bounded as a whole
//! (`MaxDescendantsPerRoot`) without any Run writing another's record.
//!
//! Each Run carries an allowance in its lineage: the Runs it may still
//! start below it. A root's is the deployment's bound. Starting `k`
//! children costs `k` of the starter's allowance, and each child is given
//! a share of what remains, `floor(rest / (k + 1))`; the starter keeps the
//! rest for its later steps. A relay step keeps back one Run for every
//! step after it, and the next step is given what the one before kept,
//! less itself.
//!
//! Why the sum over the whole tree can never exceed the bound: a Run's
//! descendants are, for each time it started children, those `k` children
//! and whatever is below them, which (by the same argument one level
//! down) is at most their shares; that is exactly `k + k * share`, what
//! the start took from its allowance, and an allowance never goes below
//! zero. From the leaves up, every Run's descendants are at most the
//! allowance it was given, the root's at most the bound, whatever order
//! and on whatever level its Runs ask (`no_tree_outgrows_its_bound`
//! below). A call whose children do not fit is refused whole with
//! `TOO_MANY_DESCENDANTS`, as a tool result the Run's model reads.

use super::children::ChildSlot;
use super::codes;
use super::CallError;
use super::Lineage;
use crate::run::Run;

/// What a Run may still start below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowance {
    /// Its allowance, what it keeps back included.
    left: u32,
    /// Kept back for the relay steps after it (each is a Run of the tree).
    reserved: u32,
}

/// What `k` new children cost their parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paid {
    /// Each child's allowance.
    pub share: u32,
    /// The parent's allowance after them.
    pub kept: u32,
}

impl Allowance {
    /// `run`'s allowance, `max` being the deployment's bound.
    pub fn of(run: &Run, max: u32) -> Allowance {
        Allowance {
            left: run
                .lineage
                .as_ref()
                .and_then(|l| l.descendants_left)
                .unwrap_or(max),
            reserved: run.chain.as_ref().map_or(0, |c| {
                u32::try_from(c.remaining().len()).unwrap_or(u32::MAX)
            }),
        }
    }

    /// How many children it may start now.
    pub fn spendable(self) -> u32 {
        self.left.saturating_sub(self.reserved)
    }

    /// Pays for `k` new children, or `None` when they do not fit.
    pub fn pay(self, k: u32) -> Option<Paid> {
        let rest = self.spendable().checked_sub(k)?;
        let share = rest / (k + 1);
        // k + k * share <= k + rest <= spendable <= left.
        Some(Paid {
            share,
            kept: self.left - k - k * share,
        })
    }
}

/// The call's children, unless they and the children the step's earlier
/// calls asked for are more than `run` may still start: then the call is
/// refused whole, and the calls before it keep theirs.
pub fn within(
    run: &Run,
    slots: Vec<ChildSlot>,
    earlier: usize,
    max: u32,
) -> Result<Vec<ChildSlot>, CallError> {
    let can = Allowance::of(run, max).spendable() as usize;
    if earlier + slots.len() <= can {
        return Ok(slots);
    }
    Err(CallError::new(
        codes::TOO_MANY_DESCENDANTS,
        format!(
            "this call asks for {} child runs and this step's earlier calls for {earlier}, but this run may start only {can} more: every run started from one root, on every level and in every step, counts against this deployment's limit of {max}; do the work here, or ask for fewer",
            slots.len()
        ),
    ))
}

/// Pays for `slots`, the new children of `run`: each slot is given its
/// share, and `run` keeps the rest. `false` (and nothing changed) when
/// they do not fit.
pub fn hand_out(run: &mut Run, slots: &mut [ChildSlot], max: u32) -> bool {
    let k = u32::try_from(slots.len()).unwrap_or(u32::MAX);
    let Some(paid) = Allowance::of(run, max).pay(k) else {
        return false;
    };
    for s in slots.iter_mut() {
        s.descendants = Some(paid.share);
    }
    run.lineage = Some(Lineage {
        descendants_left: Some(paid.kept),
        ..run.lineage()
    });
    true
}

/// The allowance of the relay step after `previous`: what `previous`
/// kept, less the step itself; `None` when nothing is left for it (a
/// chain longer than the bound).
pub fn next_step(previous: &Run, max: u32) -> Option<u32> {
    Allowance::of(previous, max).left.checked_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collab::chain::ChainLink;
    use crate::collab::RunKind;
    use crate::run::test_run;
    use rand::{Rng, SeedableRng};

    fn slots(n: usize) -> Vec<ChildSlot> {
        (0..n)
            .map(|i| {
                ChildSlot::queued(
                    format!("c{i}"),
                    "b".into(),
                    RunKind::Delegation,
                    Some("call".into()),
                    Some("t".into()),
                )
            })
            .collect()
    }

    #[test]
    fn children_cost_their_number_and_share_what_remains() {
        let mut root = test_run();
        assert_eq!(
            Allowance::of(&root, 10).spendable(),
            10,
            "a root has the bound"
        );
        let mut s = slots(2);
        assert!(hand_out(&mut root, &mut s, 10));
        // 10 - 2 = 8 left; each child 8 / 3 = 2; the root keeps 10 - 2 - 4.
        assert!(s.iter().all(|s| s.descendants == Some(2)));
        assert_eq!(Allowance::of(&root, 10).spendable(), 4);
        // Too many for what it kept: refused, nothing changed.
        let before = root.clone();
        assert!(!hand_out(&mut root, &mut slots(5), 10));
        assert_eq!(root, before);
        let e = within(&root, slots(3), 2, 10).unwrap_err();
        assert_eq!(e.code, codes::TOO_MANY_DESCENDANTS);
        assert!(within(&root, slots(2), 2, 10).is_ok());
        // A child starts with exactly its share.
        let mut child = test_run();
        child.lineage = Some(Lineage {
            descendants_left: s[0].descendants,
            ..root.lineage().child("b", RunKind::Delegation)
        });
        assert_eq!(Allowance::of(&child, 10).spendable(), 2);
        assert!(!hand_out(&mut child, &mut slots(3), 10));
    }

    #[test]
    fn a_record_without_an_allowance_reads_as_the_bound() {
        let mut run = test_run();
        let old = serde_json::json!({
            "root_run_id": "r", "depth": 1, "path": ["x", "a"], "kind": "delegation"
        });
        run.lineage = Some(serde_json::from_value(old).unwrap());
        assert_eq!(Allowance::of(&run, 7).spendable(), 7);
        // And a new one writes its allowance only once it has one.
        let root = serde_json::to_value(Lineage::root("r", "a")).unwrap();
        assert!(root.get("descendants_left").is_none(), "{root}");
    }

    #[test]
    fn a_relay_step_keeps_one_run_back_for_each_step_after_it() {
        let mut step = test_run();
        step.chain = Some(ChainLink {
            chain_id: "ch".into(),
            index: 0,
            steps: vec!["a".into(), "b".into(), "c".into()],
            callback_url: None,
            team: None,
        });
        let a = Allowance::of(&step, 4);
        assert_eq!(a.spendable(), 2, "two steps follow");
        assert!(hand_out(&mut step, &mut slots(2), 4));
        // It spent what it could; the two steps after it still fit.
        assert_eq!(next_step(&step, 4), Some(1));
        let mut last = test_run();
        last.lineage = Some(Lineage {
            descendants_left: Some(0),
            ..Lineage::root("ch", "c")
        });
        assert_eq!(next_step(&last, 4), None);
    }

    /// A random tree grown from one root, which is now and then the first
    /// step of a relay chain: each Run, in random rounds, asks for a random
    /// number of children (from 1 to 8, the fan-outs and plans of real
    /// trees); whatever is granted grows in turn, and each relay step that
    /// ends is followed by the next. Whatever the bound and the order, the
    /// tree below the root never has more Runs than the bound, and what is
    /// refused is refused only because it did not fit.
    #[test]
    fn no_tree_outgrows_its_bound() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(19);
        for _ in 0..400 {
            let max = rng.gen_range(0..300);
            let mut root = test_run();
            if rng.gen_bool(0.3) {
                let n = rng.gen_range(1..=16);
                root.chain = Some(ChainLink {
                    chain_id: "ch".into(),
                    index: 0,
                    steps: vec!["a".into(); n],
                    callback_url: None,
                    team: None,
                });
            }
            let mut pending = vec![root];
            let mut descendants = 0u32;
            while let Some(mut run) = pending.pop() {
                for _ in 0..rng.gen_range(0..4) {
                    let k = rng.gen_range(1..=8);
                    let can = Allowance::of(&run, max).spendable();
                    let mut s = slots(k);
                    let granted = hand_out(&mut run, &mut s, max);
                    assert_eq!(granted, k as u32 <= can, "{k} of {can}");
                    if !granted {
                        continue;
                    }
                    descendants += k as u32;
                    for slot in s {
                        let mut child = test_run();
                        child.lineage = Some(Lineage {
                            descendants_left: slot.descendants,
                            ..run.lineage().child("b", RunKind::Delegation)
                        });
                        pending.push(child);
                    }
                }
                let Some(link) = run.chain.clone().filter(|l| !l.is_last()) else {
                    continue;
                };
                if let Some(left) = next_step(&run, max) {
                    descendants += 1;
                    let mut next = test_run();
                    next.lineage = Some(Lineage {
                        descendants_left: Some(left),
                        ..Lineage::root("ch", "a")
                    });
                    next.chain = Some(link.next());
                    pending.push(next);
                } else {
                    assert!(
                        link.steps.len() as u32 - 1 > max,
                        "a chain that fits goes on"
                    );
                }
            }
            assert!(descendants <= max, "{descendants} > {max}");
        }
    }
}
