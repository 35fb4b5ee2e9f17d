//! Seeded randomness (SplitMix64) for `armada chaos`'s workload and its
//! faults, and the pollers' delivery faults: one seed, one sequence, on
//! any machine.

#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// An independent stream for `what` (the workload, the faults), so
    /// adding a draw to one does not move the other.
    pub fn fork(&self, what: &str) -> Rng {
        let mut h = self.0;
        for b in what.bytes() {
            h = h.rotate_left(5) ^ u64::from(b);
            h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        Rng(h)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_is_one_sequence_and_forks_are_apart() {
        let a: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        let mut w = Rng::new(7).fork("workload");
        let mut f = Rng::new(7).fork("faults");
        assert_ne!(w.next_u64(), f.next_u64());
        let mut r = Rng::new(1);
        assert!((0..1000)
            .map(|_| r.between(3, 5))
            .all(|n| (3..=5).contains(&n)));
    }
}
