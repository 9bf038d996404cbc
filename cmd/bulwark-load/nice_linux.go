package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// startNiced starts cmd and lowers its priority to nice value nice
// (0-19), leaving this process's alone.
//
// On Linux a nice value belongs to a thread (a new thread inherits its
// creator's), so renicing the child's pid would lower only its main
// thread, not the threads its Go runtime makes. reniceProcess sets every
// thread instead.
func startNiced(cmd *exec.Cmd, nice int) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	if err := reniceProcess(cmd.Process.Pid, nice); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("set nice %d: %w", nice, err)
	}
	return nil
}

// reniceProcess sets every thread of pid to nice, pass after pass, until a
// pass finds none to change. Then no thread is left at another value, and
// none can appear: every thread that could make one inherits nice.
func reniceProcess(pid, nice int) error {
	for range 1000 {
		entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return err
		}
		changed := 0
		for _, e := range entries {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			cur, err := taskNice(fmt.Sprintf("/proc/%d/task/%d/stat", pid, tid))
			if errors.Is(err, errThreadGone) || (err == nil && cur == nice) {
				continue
			}
			if err != nil {
				return err
			}
			if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice); err != nil {
				if errors.Is(err, syscall.ESRCH) {
					continue // ended
				}
				return fmt.Errorf("thread %d: %w", tid, err)
			}
			changed++
		}
		if changed == 0 {
			return nil
		}
	}
	return errors.New("its threads kept changing")
}
