"""Who gets in and when: permits, the wait queue, the audio hold and the start guard (`permits`),
and the rule for audio by the stages' measured speed (`audio_capacity`)."""
