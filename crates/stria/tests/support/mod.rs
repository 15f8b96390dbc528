pub mod node;
pub mod posix_table;
