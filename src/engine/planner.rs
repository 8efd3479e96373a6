//! What each window rewrites: the [`Planner`] the engine asks, while frozen, at the
//! start of every window; [`Everything`], and [`Selected`] ranges of another planner.

use crate::support::error::Result;

/// Decides what to rewrite next. Called at the start of every window, *while frozen*,
/// with the offset where the previous window stopped: it returns the ranges at or after
/// it to rewrite, ascending. Re-planning in every window is what lets the layout change
/// between windows (a filesystem allocates, frees, moves), and planning while frozen is
/// what makes the plan true for the whole window.
pub(crate) trait Planner {
    fn ranges(&mut self, cursor: u64, end: u64) -> Result<Vec<(u64, u64)>>;
    /// Where the last plan ends: a window that does all of it has done everything
    /// before this offset (file mode maps a window's worth of files at a time).
    fn planned_until(&self, end: u64) -> u64 {
        end
    }
}

/// Rewrites everything: the whole range.
pub(crate) struct Everything;

impl Planner for Everything {
    fn ranges(&mut self, cursor: u64, end: u64) -> Result<Vec<(u64, u64)>> {
        Ok(if cursor < end { vec![(cursor, end - cursor)] } else { Vec::new() })
    }
}

/// Only the `selected` ranges (ascending, non-overlapping) of what `inner` plans: for
/// selective re-sequencing of the regions a scan found slow.
pub(crate) struct Selected<'a> {
    pub(crate) inner: &'a mut dyn Planner,
    pub(crate) selected: Vec<(u64, u64)>,
}

/// Appends `(o, l)` to ascending `out`, merged into the last range where they touch.
pub(crate) fn push_merged(out: &mut Vec<(u64, u64)>, (o, l): (u64, u64)) {
    match out.last_mut() {
        Some(last) if last.0 + last.1 >= o => last.1 = last.1.max(o + l - last.0),
        _ => out.push((o, l)),
    }
}

/// The intersection of two ascending lists of non-overlapping ranges.
pub(crate) fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let (a0, a1) = (a[i].0, a[i].0 + a[i].1);
        let (b0, b1) = (b[j].0, b[j].0 + b[j].1);
        let (lo, hi) = (a0.max(b0), a1.min(b1));
        if lo < hi {
            out.push((lo, hi - lo));
        }
        if a1 < b1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

impl Planner for Selected<'_> {
    fn ranges(&mut self, cursor: u64, end: u64) -> Result<Vec<(u64, u64)>> {
        let planned = self.inner.ranges(cursor, end)?;
        Ok(intersect(&planned, &self.selected))
    }

    // The inner plan's end: a planner that maps a window's worth at a time (a hole map,
    // file mode) must not have its window taken for all of the rest.
    fn planned_until(&self, end: u64) -> u64 {
        self.inner.planned_until(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intersects_range_lists() {
        let a = [(0, 100), (200, 100)];
        let b = [(50, 200), (290, 5)];
        assert_eq!(intersect(&a, &b), vec![(50, 50), (200, 50), (290, 5)]);
        assert_eq!(intersect(&a, &[]), vec![]);
    }

    /// Plans up to `until` at a time, as a hole map or file mode does.
    struct Partial {
        until: u64,
    }

    impl Planner for Partial {
        fn ranges(&mut self, cursor: u64, end: u64) -> Result<Vec<(u64, u64)>> {
            Ok(vec![(cursor, self.until.min(end) - cursor)])
        }
        fn planned_until(&self, end: u64) -> u64 {
            self.until.min(end)
        }
    }

    #[test]
    fn a_selection_keeps_where_its_inner_plan_ends() {
        let mut inner = Partial { until: 1 << 30 };
        let sel = Selected { inner: &mut inner, selected: vec![(0, 4096), (2 << 30, 4096)] };
        assert_eq!(sel.planned_until(4 << 30), 1 << 30, "the rest, past the inner plan, is not done");
    }
}
