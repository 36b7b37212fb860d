"""Records, the results store (Parquet + DuckDB), its schema and views, and export."""
