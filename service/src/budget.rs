//! A bound on the memory the requests in flight may hold together. Each
//! request reserves a multiple of its size before its body is read; a
//! request that does not fit is turned away at once (HTTP: 503 with
//! Retry-After) or waits (a stdio reader simply stops reading), so a burst
//! of large requests cannot take a pod past its memory limit.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Reservations are counted in KiB.
const UNIT: usize = 1024;

#[derive(Clone)]
pub struct Budget {
    units: Arc<Semaphore>,
    total_units: usize,
}

/// Part of the budget, given back when dropped.
pub struct Reserved {
    permit: Option<OwnedSemaphorePermit>,
}

impl Budget {
    pub fn new(bytes: usize) -> Budget {
        let total_units = bytes.div_ceil(UNIT).max(1);
        Budget {
            units: Arc::new(Semaphore::new(total_units)),
            total_units,
        }
    }

    /// The whole budget, in bytes.
    pub fn bytes(&self) -> usize {
        self.total_units * UNIT
    }

    /// Reserves `bytes` if they are free now.
    pub fn try_reserve(&self, bytes: usize) -> Option<Reserved> {
        let units = self.units_for(bytes)?;
        let permit = self.units.clone().try_acquire_many_owned(units).ok()?;
        Some(Reserved {
            permit: Some(permit),
        })
    }

    /// Reserves `bytes`, waiting until they are free (never, for more than
    /// the whole budget: such a request gets the whole budget).
    pub async fn reserve(&self, bytes: usize) -> Reserved {
        let units = self.units_for(bytes).unwrap_or(self.total_units as u32);
        let permit = self.units.clone().acquire_many_owned(units).await.ok();
        Reserved { permit }
    }

    /// Grows a reservation by `bytes` if they are free now.
    pub fn try_grow(&self, reserved: &mut Reserved, bytes: usize) -> bool {
        let Some(more) = self.try_reserve(bytes) else {
            return false;
        };
        match (&mut reserved.permit, more.permit) {
            (Some(permit), Some(extra)) => permit.merge(extra),
            (slot @ None, extra) => *slot = extra,
            (Some(_), None) => {}
        }
        true
    }

    fn units_for(&self, bytes: usize) -> Option<u32> {
        let units = bytes.div_ceil(UNIT).max(1);
        (units <= self.total_units)
            .then(|| u32::try_from(units).ok())
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_add_up_to_the_budget_and_come_back() {
        let budget = Budget::new(64 * 1024);
        let a = budget.try_reserve(40 * 1024).expect("fits");
        assert!(budget.try_reserve(40 * 1024).is_none(), "over the budget");
        let mut b = budget.try_reserve(20 * 1024).expect("fits beside");
        assert!(!budget.try_grow(&mut b, 8 * 1024), "would pass the budget");
        drop(a);
        assert!(budget.try_grow(&mut b, 8 * 1024));
        assert!(
            budget.try_reserve(1 << 30).is_none(),
            "larger than the whole budget"
        );
    }
}
