"""Who gets in and when: permits, the wait queue, the audio hold and the start guard (`permits`),
the rule for audio by the stages' measured speed (`audio_capacity`), and the gateway's planning
over it (`audio_planner`: a request's chunk plan and start need, the hold's gate)."""
