//! The checks of every window, as a list: each a [`WindowCheck`], run in order by
//! [`Checked`], the one guard around the freeze. A check acts only where it looks (every
//! method has a default that does nothing); what no check answers, the freeze answers,
//! and the freeze's own trait ([`WindowGuard`]) has no defaults. The list of a run is
//! made in one place, `rewrite::sequence::checks`.

use std::time::Duration;

use crate::engine::guard::{Reporter, WindowEnd, WindowGuard};
use crate::support::error::{Error, Result};

/// One check of every window.
pub(crate) trait WindowCheck {
    /// Before the window begins (`freezes`: whether windows freeze anything).
    fn before_window(&mut self, _freezes: bool) -> Result<()> {
        Ok(())
    }
    /// The window has begun (frozen, where windows freeze).
    fn window_began(&mut self) {}
    /// Within the window, before each chunk's write.
    fn recheck(&mut self, _freezes: bool) -> Result<()> {
        Ok(())
    }
    /// What the next permit is for: `len` bytes at device offset `offset`.
    fn announce(&mut self, _offset: u64, _len: u64) {}
    /// The last look before a permit is asked for (a permit granted must be followed by
    /// its write); `guard` answers whether its freeze held. Ok(false): the window is
    /// over, nothing more is written in it.
    fn before_permit(&mut self, _guard: &mut dyn WindowGuard) -> Result<bool> {
        Ok(true)
    }
    /// The permit's answer to the announced write.
    fn permitted(&mut self, _granted: bool) {}
    /// The last look before the thaw; what it found counts once the window has ended
    /// (the thaw comes first, whatever it found).
    fn before_thaw(&mut self, _guard: &mut dyn WindowGuard) -> Result<()> {
        Ok(())
    }
    /// After the thaw.
    fn after_thaw(&mut self) -> Result<()> {
        Ok(())
    }
    /// The device ranges written since this check's records last saw no foreign write;
    /// None where it keeps no such records.
    fn at_risk(&self) -> Option<Vec<(u64, u64)>> {
        None
    }
}

/// A guard and the checks every window runs, in the list's order.
pub(crate) struct Checked<G: WindowGuard> {
    guard: G,
    checks: Vec<Box<dyn WindowCheck>>,
}

impl<G: WindowGuard> Checked<G> {
    pub(crate) fn new(guard: G, checks: Vec<Box<dyn WindowCheck>>) -> Checked<G> {
        Checked { guard, checks }
    }
}

impl<G: WindowGuard> WindowGuard for Checked<G> {
    fn freezes(&self) -> bool {
        self.guard.freezes()
    }
    fn deadline(&self) -> Option<Duration> {
        self.guard.deadline()
    }
    fn begin(&mut self) -> Result<()> {
        let freezes = self.guard.freezes();
        for c in &mut self.checks {
            c.before_window(freezes)?;
        }
        self.guard.begin()?;
        self.checks.iter_mut().for_each(|c| c.window_began());
        Ok(())
    }
    fn recheck(&mut self) -> Result<()> {
        let freezes = self.guard.freezes();
        for c in &mut self.checks {
            c.recheck(freezes)?;
        }
        self.guard.recheck()
    }
    fn announce(&mut self, offset: u64, len: u64, hash: &blake3::Hash) {
        self.checks.iter_mut().for_each(|c| c.announce(offset, len));
        self.guard.announce(offset, len, hash)
    }
    fn may_write(&mut self) -> Result<bool> {
        for c in &mut self.checks {
            if !c.before_permit(&mut self.guard)? {
                return Ok(false);
            }
        }
        let granted = self.guard.may_write()?;
        self.checks.iter_mut().for_each(|c| c.permitted(granted));
        Ok(granted)
    }
    fn wrote(&mut self) -> Result<()> {
        self.guard.wrote()
    }
    fn reporter(&self) -> Result<Reporter> {
        self.guard.reporter()
    }
    fn held(&mut self) -> Result<bool> {
        self.guard.held()
    }
    /// The checks' last looks, then the thaw, whatever they found. A freeze lost to
    /// another program explains what they found (the filesystem wrote): it is the error.
    fn end(&mut self) -> Result<WindowEnd> {
        let looks: Vec<Result<()>> = self.checks.iter_mut().map(|c| c.before_thaw(&mut self.guard)).collect();
        let end = self.guard.end();
        if matches!(end, Err(Error::FreezeLost { .. })) {
            return end;
        }
        looks.into_iter().collect::<Result<()>>()?;
        for c in &mut self.checks {
            c.after_thaw()?;
        }
        end
    }
    fn at_risk(&self) -> Option<Vec<(u64, u64)>> {
        let found: Vec<Vec<(u64, u64)>> = self.checks.iter().filter_map(|c| c.at_risk()).collect();
        if found.is_empty() {
            return self.guard.at_risk();
        }
        Some(crate::support::error::merged(found.concat()))
    }
}
