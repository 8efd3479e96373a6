//! Python's `random.Random` (MT19937 and `randrange`), bit for bit.
//!
//! Why: the FTL model's Python reference (docs/FTL-MODEL.md) draws its random LBAs and
//! its noise writer's LBAs from `random.Random(seed)`. Same inputs must give the same
//! virtual times to 0.1 %, and a different generator moves results by up to 0.5 %
//! (docs/FTL-MODEL.md), so we reproduce CPython's generator: `init_by_array` seeding from the
//! integer's 32-bit words, `getrandbits`, and `_randbelow`'s rejection sampling.

const N: usize = 624;
const M: usize = 397;

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct PyRandom {
    mt: Vec<u32>,
    index: usize,
}

impl PyRandom {
    /// `random.Random(seed)` for a non-negative integer seed.
    pub(crate) fn new(seed: u64) -> PyRandom {
        // CPython random_seed(): key = the 32-bit words of abs(seed), least significant first.
        let mut key = vec![seed as u32];
        if seed >> 32 != 0 {
            key.push((seed >> 32) as u32);
        }
        let mut r = PyRandom { mt: vec![0; N], index: N };
        r.init_by_array(&key);
        r
    }

    fn init_genrand(&mut self, s: u32) {
        self.mt[0] = s;
        for i in 1..N {
            let prev = self.mt[i - 1];
            self.mt[i] = 1_812_433_253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(i as u32);
        }
        self.index = N;
    }

    fn init_by_array(&mut self, key: &[u32]) {
        self.init_genrand(19_650_218);
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            let prev = self.mt[i - 1];
            self.mt[i] = (self.mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j = (j + 1) % key.len();
            if i >= N {
                self.mt[0] = self.mt[N - 1];
                i = 1;
            }
        }
        for _ in 0..N - 1 {
            let prev = self.mt[i - 1];
            self.mt[i] = (self.mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_566_083_941)).wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                self.mt[0] = self.mt[N - 1];
                i = 1;
            }
        }
        self.mt[0] = 0x8000_0000;
    }

    fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            for kk in 0..N {
                let y = (self.mt[kk] & 0x8000_0000) | (self.mt[(kk + 1) % N] & 0x7fff_ffff);
                let mag = if y & 1 != 0 { 0x9908_b0df } else { 0 };
                self.mt[kk] = self.mt[(kk + M) % N] ^ (y >> 1) ^ mag;
            }
            self.index = 0;
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `getrandbits(k)` for 1 <= k <= 64.
    fn getrandbits(&mut self, k: u32) -> u64 {
        if k <= 32 {
            return u64::from(self.next_u32() >> (32 - k));
        }
        // CPython fills 32-bit words least significant first; the last word is shifted.
        let lo = u64::from(self.next_u32());
        let hi = u64::from(self.next_u32() >> (64 - k));
        lo | (hi << 32)
    }

    /// `randrange(start, stop)`.
    pub(crate) fn randrange(&mut self, start: u64, stop: u64) -> u64 {
        let n = stop - start;
        assert!(n > 0, "empty range for randrange");
        let k = 64 - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return start + r;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values printed by CPython 3.11:
    /// `r = random.Random(1); [r.randrange(1 << 20) for _ in range(5)]` and
    /// `r = random.Random(7); [r.randrange(1000, 5000) for _ in range(3)]`.
    #[test]
    fn matches_cpython() {
        let mut r = PyRandom::new(1);
        let got: Vec<u64> = (0..5).map(|_| r.randrange(0, 1 << 20)).collect();
        assert_eq!(got, include!("../../tests/fixtures/pyrandom_seed1.txt"));
        let mut r = PyRandom::new(7);
        let got: Vec<u64> = (0..3).map(|_| r.randrange(1000, 5000)).collect();
        assert_eq!(got, include!("../../tests/fixtures/pyrandom_seed7.txt"));
    }
}
