//! What a server says about its tools, checked before an agent sees it:
//! the fingerprints a person pins ([`fingerprint`]), the pins each listed
//! tool is held to ([`pins`]), and the poisoning scan of every text a model
//! is shown ([`scan`], its rules in `poisoning.yaml`).

pub mod fingerprint;
pub mod pins;
pub mod scan;

pub use fingerprint::Fingerprint;
pub use pins::{Drift, Pin, Pins, Standing, Trust};
pub use scan::{Class, Context, Finding, Scanner};
