//! Dates beyond ISO 8601 (US, EU and year-first forms, with an optional time of day): the
//! parsing lives in kiln-model (`kiln_model::dates`), where the serving tier reads a date
//! feature the same way; re-exported here for the data layer.

pub use kiln_model::dates::{
    ColumnOrder, DateOrder, DatePart, column_order, day_of, is_date, parse_date,
};
