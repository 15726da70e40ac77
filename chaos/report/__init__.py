"""What a judged run says: the report, its HTML page and the timeline."""
