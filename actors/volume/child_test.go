package volume

const childEnv = "CSIACTOR_VOLUME_TEST_CHILD"

func runChild() int { return 0 }
