//! A random number generator whose output is fixed by this file, not by a dependency's
//! version: xoshiro256** (Blackman and Vigna), seeded through SplitMix64. The simulation and
//! openraft's election timeouts (through [`crate::types::seed_thread_rng`]) draw from it, so a
//! seed replays the same run on any build.

/// See the module docs.
#[derive(Debug, Clone)]
pub struct StableRng {
    s: [u64; 4],
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl StableRng {
    pub fn seed(seed: u64) -> StableRng {
        let mut st = seed;
        StableRng {
            s: [
                splitmix64(&mut st),
                splitmix64(&mut st),
                splitmix64(&mut st),
                splitmix64(&mut st),
            ],
        }
    }

    pub fn step(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    fn fill(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let v = self.step().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

impl rand::RngCore for StableRng {
    fn next_u32(&mut self) -> u32 {
        (self.step() >> 32) as u32
    }
    fn next_u64(&mut self) -> u64 {
        self.step()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.fill(dest);
    }
}

impl rand08::RngCore for StableRng {
    fn next_u32(&mut self) -> u32 {
        (self.step() >> 32) as u32
    }
    fn next_u64(&mut self) -> u64 {
        self.step()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.fill(dest);
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand08::Error> {
        self.fill(dest);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_fixed_by_the_seed() {
        // Pinned values: a change here changes every simulated schedule.
        let mut r = StableRng::seed(42);
        let first: Vec<u64> = (0..3).map(|_| r.step()).collect();
        let mut again = StableRng::seed(42);
        assert_eq!(first, (0..3).map(|_| again.step()).collect::<Vec<_>>());
        let mut other = StableRng::seed(43);
        assert_ne!(first[0], other.step());
        assert_eq!(first, PINNED_42);
    }

    const PINNED_42: [u64; 3] = [
        1546998764402558742,
        6990951692964543102,
        12544586762248559009,
    ];
}
