"""The model: values and rules without storage. Queue and queue-manager attributes
(``definitions``), the message (``messages``), what a put accepts (``put``), message groups and
segments (``groups``), the dead-letter header (``dead_letter``) and ranges of messages (``ranges``)."""
