"""Mail provider adapters. Each imports only its own client library; differences end here."""
