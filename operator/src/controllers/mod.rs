//! The controllers: feeds that keep the index current, and status writers
//! that report what the index concluded (only on the lease holder, and only
//! when the status really changes).

pub mod conditions;
pub mod connection_health;
pub mod feed;
pub mod policy_status;
