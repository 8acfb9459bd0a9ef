"""The billing example as a Django app: invoices, and a summary per account that one worker
at a time rebuilds under a lease."""
