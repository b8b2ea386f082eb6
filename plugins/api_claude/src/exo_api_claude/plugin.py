"""Hook implementations of the api_claude plugin."""
