"""A small billing application: invoices, and a summary per account that a worker rebuilds under
a lease (the example of docs/testing-your-workers.md)."""
