//! fd (being written).
